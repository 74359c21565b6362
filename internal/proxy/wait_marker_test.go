package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The write WAIT counts from is the proxy's, not the client's: it must
// not show up in what the application sees. A PUBLISH did, to every
// PSUBSCRIBE * (found by the differential sweep); Redis 7's SPUBLISH is
// replicated in standalone mode too, and no pattern matches it.
func TestWaitMarkerUnseenByPatternSubscribers(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	replica := onlineReplica(t, p.Redis)
	watcher := p.Redis.Client(t).PSubscribe(ctx, "*")
	defer watcher.Close()
	if _, err := watcher.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	// The marker still makes WAIT wait for the client's writes: a
	// marker Redis did not replicate would leave the connection's offset
	// at 0, and WAIT would count the frozen replica.
	waitCountsWrites(t, p.Client(t), replica)
	// Whatever the WAITs published came before this fence.
	if err := p.Redis.Client(t).Publish(ctx, "wm:fence", "x").Err(); err != nil {
		t.Fatal(err)
	}
	msg, err := watcher.ReceiveMessage(ctx)
	if err != nil || msg.Channel != "wm:fence" {
		t.Fatalf("PSUBSCRIBE * saw %+v %v before the fence", msg, err)
	}
}

// WAIT's count is only an answer when Redis took the marker: refused (an
// upstream user without pub/sub rights), the connection's last write may
// be none of the client's, and Redis would count replicas that lack the
// client's write. The client gets the refusal instead of a count.
func TestWaitMarkerRefusedIsNoCount(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).Do(ctx, "ACL", "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish", "-spublish").Err(); err != nil {
		t.Fatal(err)
	}
	replica := onlineReplica(t, rs)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Username, c.Upstream.Password = "nopub", "pw"
	})
	c := p.Client(t, func(o *redis.Options) { o.Username, o.Password = "nopub", "pw" })
	if err := c.Set(ctx, "wm:1", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	replica.Freeze(t)
	defer replica.Thaw(t)
	if err := c.Set(ctx, "wm:2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := c.Wait(ctx, 1, 300*time.Millisecond).Result()
	if err == nil || !strings.Contains(err.Error(), "refused the write of the proxy's that WAIT counts from") || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("WAIT whose marker Redis refused: %d %v, want the refusal", n, err)
	}
}

// An upstream user allowed PUBLISH but not SPUBLISH (an ACL written
// before the marker changed) still gets WAIT's count: the refused
// SPUBLISH is sent again as a PUBLISH (found by review: every WAIT was
// refused). The frozen replica shows the PUBLISH is what WAIT counted
// from.
func TestWaitMarkerFallsBackToPublish(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).Do(ctx, "ACL", "SETUSER", "nospub", "on", ">pw", "~*", "&*", "+@all", "-spublish").Err(); err != nil {
		t.Fatal(err)
	}
	replica := onlineReplica(t, rs)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Username, c.Upstream.Password = "nospub", "pw"
	})
	c := p.Client(t, func(o *redis.Options) { o.Username, o.Password = "nospub", "pw" })
	if err := c.Set(ctx, "wm:0", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, c, 1, 5*time.Second, 1, "live replica, the first WAIT")
	waitCountsWrites(t, c, replica)
}

// waitCountsWrites checks that WAIT through c counts from c's writes: one
// replica has a write made while replica is live, none a write made once
// it is frozen (it stays frozen until the test ends).
func waitCountsWrites(t *testing.T, c *redis.Client, replica *redistest.Server) {
	t.Helper()
	if err := c.Set(ctx, "wm:live", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, c, 1, 5*time.Second, 1, "live replica")
	replica.Freeze(t)
	t.Cleanup(func() { replica.Thaw(t) })
	if err := c.Set(ctx, "wm:frozen", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, c, 1, 300*time.Millisecond, 0, "frozen replica")
}
