package proxy_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
)

// TestRingReviewListenerNamespace: a listener's namespace; the ring must
// hash the key Redis stores ("ns{x}:k"), hash tags included.
func TestRingReviewListenerNamespace(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) {
		c.Server.Listeners = []config.Listener{{Name: "tenant", Listen: "127.0.0.1:0", Namespace: "ns:"}}
	})
	c := redis.NewClient(&redis.Options{Addr: r.p.Addrs["tenant"], MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	bad := 0
	for i := range 60 {
		k := "k:" + ringKey(i)
		if i%3 == 0 {
			k = "{g" + strconv.Itoa(i) + "}:" + k
		}
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		stored := "ns:" + k
		on := r.on(stored)
		if want := r.ring.Pick([]byte(stored)); len(on) != 1 || on[0] != want {
			if bad++; bad <= 3 {
				t.Errorf("%q stored as %q on %v, ring of the stored key %d, of the client's %d", k, stored, on, want, r.ring.Pick([]byte(k)))
			}
		}
		if v := c.Get(ctx, k).Val(); v != "v" {
			t.Errorf("GET %s back = %q", k, v)
		}
	}
	// Keyspace notification of a namespaced key through the ring.
	for _, d := range r.direct {
		d.ConfigSet(ctx, "notify-keyspace-events", "KA")
	}
	k := "note:" + ringKey(5)
	sub := c.Subscribe(ctx, "__keyspace@0__:"+k)
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, k, "v", 0)
	select {
	case m := <-sub.Channel():
		t.Logf("namespaced keyspace notification: %s %s", m.Channel, m.Payload)
	case <-time.After(2 * time.Second):
		t.Errorf("namespaced SUBSCRIBE __keyspace@0__:%s heard nothing (stored key on shard %d)", k, r.ring.Pick([]byte("ns:"+k)))
	}
	sub.Close()
}

func TestRingReviewChannelRoutePublish(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) {
		c.ChannelRoutes = []config.Route{{Pattern: "news*", Upstream: "s1"}}
	})
	sub := r.p.Client(t).Subscribe(ctx, "news:1")
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.c.Publish(ctx, "news:1", "hi").Val(); n != 1 {
		t.Errorf("PUBLISH news:1 = %d receivers", n)
	}
	select {
	case m := <-sub.Channel():
		if m.Payload != "hi" {
			t.Errorf("%v", m)
		}
	case <-time.After(2 * time.Second):
		t.Error("no message")
	}
	if n := r.direct[1].PubSubNumSub(ctx, "news:1").Val()["news:1"]; n != 1 {
		t.Errorf("subscription on s1: %d", n)
	}
	sub.Close()
}
