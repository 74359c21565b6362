package proxy_test

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Pub/sub with routes: what a client asks about channels, or subscribes
// to, must reach the upstream where those channels' messages are
// published ([[channel_route]]). startRouted sends jobs.* channels to
// "queue", the rest to [upstream].

// TestRoutesPubsubNumsub: PUBSUB NUMSUB of a channel routed to a named
// upstream asks that upstream (it asked [upstream], which never has its
// subscribers, and answered 0); channels of several upstreams are asked
// of each and answered in the client's order; CHANNELS and NUMPAT ask
// every upstream.
func TestRoutesPubsubNumsub(t *testing.T) {
	r := startRouted(t, nil)
	sub := r.p.Client(t).Subscribe(ctx, "jobs.new")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	news := r.p.Client(t).Subscribe(ctx, "news")
	t.Cleanup(func() { news.Close() })
	if _, err := news.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := r.c.PubSubNumSub(ctx, "jobs.new").Result()
	if err != nil || n["jobs.new"] != 1 {
		t.Fatalf("PUBSUB NUMSUB jobs.new = %v %v; want 1 (one subscriber through the proxy, on the queue server)", n, err)
	}
	// Over two upstreams: split, merged in the client's order.
	v, err := r.c.Do(ctx, "PUBSUB", "NUMSUB", "news", "jobs.new", "jobs.none", "other").Result()
	if err != nil || fmt.Sprint(v) != "[news 1 jobs.new 1 jobs.none 0 other 0]" {
		t.Fatalf("PUBSUB NUMSUB news jobs.new jobs.none other = %v %v", v, err)
	}
	if v, err := r.c.Do(ctx, "PUBSUB", "SHARDNUMSUB", "jobs.new").Result(); err != nil || fmt.Sprint(v) != "[jobs.new 0]" {
		t.Fatalf("PUBSUB SHARDNUMSUB jobs.new = %v %v", v, err)
	}
	chans, err := r.c.PubSubChannels(ctx, "*").Result()
	if err != nil || !strings.Contains(fmt.Sprint(chans), "jobs.new") || !strings.Contains(fmt.Sprint(chans), "news") {
		t.Fatalf("PUBSUB CHANNELS = %v %v; want jobs.new (queue) and news (default)", chans, err)
	}
	// A pattern subscriber on the queue upstream counts in NUMPAT.
	ps := r.p.Client(t).PSubscribe(ctx, "jobs.*")
	t.Cleanup(func() { ps.Close() })
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if np, err := r.c.PubSubNumPat(ctx).Result(); err != nil || np != 1 {
		t.Fatalf("PUBSUB NUMPAT = %d %v; want 1 (a PSUBSCRIBE jobs.* on the queue server)", np, err)
	}
	// In a transaction NUMSUB is a command of its channels' upstream, as
	// PUBLISH is; CHANNELS and NUMPAT concern every upstream and are
	// refused there, as DBSIZE is.
	tx := r.p.Client(t).TxPipeline()
	ns := tx.PubSubNumSub(ctx, "jobs.new")
	tx.Get(ctx, "queue:none")
	if _, err := tx.Exec(ctx); err != nil && err != redis.Nil || ns.Val()["jobs.new"] != 1 {
		t.Fatalf("MULTI; PUBSUB NUMSUB jobs.new; GET queue:none; EXEC = %v %v", ns.Val(), err)
	}
	tx = r.p.Client(t).TxPipeline()
	tx.PubSubNumSub(ctx, "jobs.new")
	tx.Get(ctx, "plain:none")
	if _, err := tx.Exec(ctx); err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("a transaction with NUMSUB of queue's channel and a key of default: %v; want EXECABORT", err)
	}
	tx = r.p.Client(t).TxPipeline()
	tx.PubSubChannels(ctx, "*")
	if _, err := tx.Exec(ctx); err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("PUBSUB CHANNELS in a transaction: %v; want EXECABORT", err)
	}
}

// TestRoutesPsubscribeMissesRoutedChannels: a PSUBSCRIBE pattern is
// routed as if it were a channel name, so "job*" subscribed on [upstream]
// while PUBLISH jobs.new went to queue, and was silently never heard. A
// pattern that may match channels routed elsewhere than itself is now
// refused, naming both upstreams; one that may not is subscribed and
// hears its channels.
func TestRoutesPsubscribeMissesRoutedChannels(t *testing.T) {
	r := startRouted(t, nil)
	sub := r.p.Client(t).PSubscribe(ctx, "job*")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err == nil {
		n, err := r.c.Publish(ctx, "jobs.new", "hello").Result()
		t.Fatalf("PSUBSCRIBE job* accepted; PUBLISH jobs.new then reached %d subscribers, %v (want PSUBSCRIBE refused)", n, err)
	} else if !strings.Contains(err.Error(), "'queue'") || !strings.Contains(err.Error(), "'default'") {
		t.Fatalf("PSUBSCRIBE job* refused without naming both upstreams: %v", err)
	} else {
		t.Logf("PSUBSCRIBE job*: %v", err)
	}
	// Within one route: subscribed there, and hears it.
	ok := r.p.Client(t).PSubscribe(ctx, "jobs.*")
	t.Cleanup(func() { ok.Close() })
	if _, err := ok.Receive(ctx); err != nil {
		t.Fatalf("PSUBSCRIBE jobs.*: %v", err)
	}
	if n, err := r.c.Publish(ctx, "jobs.new", "hello").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH jobs.new reached %d subscribers, %v; want the PSUBSCRIBE jobs.* one", n, err)
	}
	// Matching no routed channel: on [upstream], as before.
	def := r.p.Client(t).PSubscribe(ctx, "news.*")
	t.Cleanup(func() { def.Close() })
	if _, err := def.Receive(ctx); err != nil {
		t.Fatalf("PSUBSCRIBE news.*: %v", err)
	}
	if n, err := r.c.Publish(ctx, "news.a", "x").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH news.a reached %d subscribers, %v; want the PSUBSCRIBE news.* one", n, err)
	}
	if m, err := def.ReceiveMessage(ctx); err != nil || m.Payload != "x" {
		t.Fatalf("news.* subscriber: %v %v", m, err)
	}
	// Added later on a subscribed connection: refused as well.
	err := def.PSubscribe(ctx, "job*")
	if err == nil {
		_, err = def.Receive(ctx)
	}
	if err == nil || !strings.Contains(err.Error(), "'queue'") {
		t.Fatalf("PSUBSCRIBE job* on a connection subscribed on default: %v; want the refusal", err)
	}
}

// TestRoutesResp2RelayRefusalText: on a RESP2 subscribed connection the
// routes' refusal of another upstream's channel was sent as an EVAL,
// which Redis refuses in RESP2 subscribed mode with its own, unrelated
// error ("only (P|S)SUBSCRIBE / ... are allowed in this context"). It must
// say why, naming the upstreams.
func TestRoutesResp2RelayRefusalText(t *testing.T) {
	r := startRouted(t, nil)
	nc := r.p.Dial(t)
	fmt.Fprint(nc, "*2\r\n$9\r\nSUBSCRIBE\r\n$6\r\njobs.x\r\n")
	for range 6 {
		readLine(t, nc)
	}
	fmt.Fprint(nc, "*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nnews\r\n")
	got := readLine(t, nc)
	t.Logf("refusal: %q", got)
	if !strings.Contains(got, "redproxy") || !strings.Contains(got, "'default'") || !strings.Contains(got, "'queue'") {
		t.Fatalf("SUBSCRIBE news (default upstream) on a RESP2 connection subscribed on queue: %q; want the proxy's refusal naming the upstreams", got)
	}
	// The connection still serves its subscription.
	fmt.Fprint(nc, "*1\r\n$4\r\nPING\r\n")
	if l := readLine(t, nc); l != "*2\r\n" {
		t.Fatalf("PING after the refusal: %q", l)
	}
}

// routedJobsSubscriber starts a routed proxy with plain:a = va on the
// default upstream and returns it with a client subscribed to jobs.x,
// whose relay is on the queue upstream.
func routedJobsSubscriber(t *testing.T) (*routed, net.Conn) {
	t.Helper()
	r := startRouted(t, nil)
	if err := r.c.Set(ctx, "plain:a", "va", 0).Err(); err != nil {
		t.Fatal(err)
	}
	nc := r.p.Dial(t)
	fmt.Fprint(nc, "*2\r\n$9\r\nSUBSCRIBE\r\n$6\r\njobs.x\r\n")
	for range 6 {
		readLine(t, nc)
	}
	return r, nc
}

// TestRoutesAfterUnsubscribeAll: a RESP2 client that unsubscribed from
// everything is a normal client again, as on Redis: its relay hands it
// back to the shared connections (relayexit.go), so a key of another
// upstream than the relay's is read there, as Jedis's and redis-py's
// pooled connections expect.
func TestRoutesAfterUnsubscribeAll(t *testing.T) {
	r, nc := routedJobsSubscriber(t)
	if err := r.c.Set(ctx, "queue:a", "qa", 0).Err(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(nc, "*1\r\n$11\r\nUNSUBSCRIBE\r\n")
	for range 6 {
		readLine(t, nc)
	}
	// A key of the relay's upstream: read there.
	fmt.Fprint(nc, "*2\r\n$3\r\nGET\r\n$7\r\nqueue:a\r\n")
	if l := readLine(t, nc); l != "$2\r\n" {
		t.Fatalf("GET queue:a after UNSUBSCRIBE (all): %q", l)
	}
	readLine(t, nc)
	// Another upstream's key: read on its own upstream.
	fmt.Fprint(nc, "*2\r\n$3\r\nGET\r\n$7\r\nplain:a\r\n")
	if l := readLine(t, nc); l != "$2\r\n" {
		t.Fatalf("GET plain:a after UNSUBSCRIBE (all): %q", l)
	}
	if l := readLine(t, nc); l != "va\r\n" {
		t.Fatalf("GET plain:a after UNSUBSCRIBE (all): %q", l)
	}
}

// The same with the commands in the write of the last UNSUBSCRIBE: they
// were relayed with it, and a key of another upstream refused.
func TestRoutesAfterUnsubscribeAllInOneWrite(t *testing.T) {
	_, nc := routedJobsSubscriber(t)
	fmt.Fprint(nc, "*1\r\n$11\r\nUNSUBSCRIBE\r\n*2\r\n$3\r\nGET\r\n$7\r\nplain:a\r\n")
	for range 6 {
		readLine(t, nc)
	}
	if l := readLine(t, nc); l != "$2\r\n" {
		t.Fatalf("GET plain:a behind UNSUBSCRIBE (all): %q", l)
	}
	if l := readLine(t, nc); l != "va\r\n" {
		t.Fatalf("GET plain:a behind UNSUBSCRIBE (all): %q", l)
	}
}

// CLIENT TRACKING ON (and NO-TOUCH ON) are refused with routes on a
// subscribed connection too, as on a connection of its own: a RESP3
// subscriber turned tracking on, heard only its relay's upstream, and
// kept a value it had cached after a reload routed the key elsewhere and
// another client's acknowledged write went there (found by a probe).
func TestRoutesRefuseTrackingOnASubscribedConnection(t *testing.T) {
	r := startRouted(t, nil)
	c := dialRaw(t, r.p.Addr)
	c.do("HELLO", "3")
	c.send([]string{"SUBSCRIBE", "news"})
	c.readReply() // the subscription's push
	// (CLIENT NO-TOUCH is Redis 7.2's: 7.0 answers it "unknown subcommand".)
	for _, cmd := range [][]string{{"CLIENT", "TRACKING", "ON"}, {"CLIENT", "TRACKING", "ON", "BCAST"}} {
		c.send(cmd)
		v := c.readNonPush()
		if e, ok := v.(respError); !ok || !strings.Contains(string(e), "ON is not supported with routes yet") {
			t.Errorf("%q on a subscribed connection with routes: %#v, want the refusal", cmd, v)
		}
	}
	c.send([]string{"CLIENT", "TRACKINGINFO"})
	if v := fmt.Sprint(c.readNonPush()); !strings.Contains(v, "off") {
		t.Errorf("CLIENT TRACKINGINFO after the refusals: %s, want tracking off", v)
	}
}
