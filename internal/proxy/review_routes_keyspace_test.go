package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReviewRoutesKeyspaceNotificationsLost: with routes, a keyspace
// notification channel (__keyspace@0__:<key>) is routed as an ordinary
// channel name, by [[channel_route]], so it subscribes on [upstream]
// while Redis publishes the notification on the server that holds the
// key, the key's route's upstream. SUBSCRIBE __keyspace@0__:queue:a is
// accepted and never hears the SET queue:a made through the same proxy.
// The proxy refuses PSUBSCRIBE patterns that could silently miss messages
// (docs/COMPATIBILITY.md, Routes); here they are silently lost.
//
// (Fixed: the channel now goes where its key does. A subscribed
// connection is a relay to one upstream, so the two keys' channels, on
// 'queue' and 'default', are subscribed on a connection each; asked in
// one SUBSCRIBE they are refused, as channels of two upstreams are.)
func TestReviewRoutesKeyspaceNotificationsLost(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {})
	for _, s := range []*redistest.Server{r.def, r.queue, r.cach} {
		if err := s.Client(t).ConfigSet(ctx, "notify-keyspace-events", "KA").Err(); err != nil {
			t.Fatal(err)
		}
	}
	both := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }).Subscribe(ctx, "__keyspace@0__:queue:a", "__keyspace@0__:plain:a")
	defer both.Close()
	if _, err := both.Receive(ctx); err == nil || !strings.Contains(err.Error(), "different upstreams") {
		t.Fatalf("SUBSCRIBE of the keyspace channels of a key on 'queue' and one on 'default': %v; want them refused as channels of two upstreams", err)
	}
	ch := make(chan *redis.Message, 16)
	for _, name := range []string{"__keyspace@0__:queue:a", "__keyspace@0__:plain:a"} {
		sub := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }).Subscribe(ctx, name)
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil { // subscribe confirmation
			t.Fatalf("SUBSCRIBE %s: %v", name, err)
		}
		go func() {
			for m := range sub.Channel() {
				ch <- m
			}
		}()
	}
	got := map[string]bool{}
	deadline := time.After(3 * time.Second)
	for _, k := range []string{"queue:a", "plain:a"} {
		if err := r.c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for len(got) < 2 {
		select {
		case m := <-ch:
			got[m.Channel] = true
		case <-deadline:
			t.Fatalf("after SET queue:a and SET plain:a through the proxy, the subscribers to both keys' keyspace channels heard only %v: queue:a lives on upstream 'queue', but its keyspace channel was subscribed on 'default'", got)
		}
	}
}

// TestRoutesKeyspaceNotificationPatterns: what the routes cannot hear on
// one subscribed connection is refused, not silently lost (a subscribed
// connection is a relay to one upstream, and each upstream publishes the
// notifications of its own keys): __keyevent@ channels, and patterns that
// may match keyspace channels of keys on several upstreams. A keyspace
// pattern within one key route subscribes on that route's upstream and
// hears its keys; PUBLISH to a keyspace channel goes where its
// subscribers are.
func TestRoutesKeyspaceNotificationPatterns(t *testing.T) {
	r := startRouted(t, nil)
	for _, s := range []*redistest.Server{r.def, r.queue, r.cach} {
		if err := s.Client(t).ConfigSet(ctx, "notify-keyspace-events", "KEA").Err(); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, sub *redis.PubSub) {
		t.Helper()
		defer sub.Close()
		_, err := sub.Receive(ctx)
		if err == nil || !strings.Contains(err.Error(), "redproxy") {
			t.Fatalf("%s: %v; want the proxy's refusal", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	c := func() *redis.Client { return r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }) }
	refused("SUBSCRIBE __keyevent@0__:set", c().Subscribe(ctx, "__keyevent@0__:set"))
	refused("PSUBSCRIBE __keyevent@0__:*", c().PSubscribe(ctx, "__keyevent@0__:*"))
	refused("PSUBSCRIBE __keyspace@0__:*", c().PSubscribe(ctx, "__keyspace@0__:*"))
	refused("PSUBSCRIBE __keyspace@*__:queue:*", c().PSubscribe(ctx, "__keyspace@*__:queue:*"))
	refused("PSUBSCRIBE *", c().PSubscribe(ctx, "*"))
	refused("PSUBSCRIBE __keyspace@0__:que*", c().PSubscribe(ctx, "__keyspace@0__:que*"))

	// Within the queue:* route: subscribed on 'queue', hears queue:b.
	sub := c().PSubscribe(ctx, "__keyspace@0__:queue:*")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatalf("PSUBSCRIBE __keyspace@0__:queue:*: %v", err)
	}
	if err := r.c.Set(ctx, "queue:b", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := sub.ReceiveMessage(ctx)
	if err != nil || m.Channel != "__keyspace@0__:queue:b" || m.Payload != "set" {
		t.Fatalf("PSUBSCRIBE __keyspace@0__:queue:* after SET queue:b: %v %v", m, err)
	}
	// A later pattern on the same connection over another route's keys:
	// refused as a channel of another upstream.
	err = sub.PSubscribe(ctx, "__keyspace@0__:cache:*")
	if err == nil {
		_, err = sub.Receive(ctx)
	}
	if err == nil || !strings.Contains(err.Error(), "'cache'") {
		t.Fatalf("PSUBSCRIBE __keyspace@0__:cache:* on a connection subscribed on queue: %v; want the refusal", err)
	}
	// PUBLISH to a keyspace channel reaches its subscribers, on the key's
	// upstream; PUBSUB NUMSUB counts them there.
	if n, err := r.c.Publish(ctx, "__keyspace@0__:queue:c", "x").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH __keyspace@0__:queue:c reached %d subscribers, %v; want the pattern subscriber", n, err)
	}
	// Without key routes to other upstreams every notification is
	// [upstream]'s: keyevent channels are heard there.
	one := startRouted(t, func(c *config.Config) { c.Routes = nil })
	if err := one.def.Client(t).ConfigSet(ctx, "notify-keyspace-events", "KEA").Err(); err != nil {
		t.Fatal(err)
	}
	ev := one.p.Client(t).Subscribe(ctx, "__keyevent@0__:set")
	defer ev.Close()
	if _, err := ev.Receive(ctx); err != nil {
		t.Fatalf("SUBSCRIBE __keyevent@0__:set with channel routes only: %v", err)
	}
	if err := one.c.Set(ctx, "queue:b", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if m, err := ev.ReceiveMessage(ctx); err != nil || m.Payload != "queue:b" {
		t.Fatalf("__keyevent@0__:set after SET queue:b: %v %v", m, err)
	}
}
