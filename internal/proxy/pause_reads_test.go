package proxy_test

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReadsAnsweredDuringAPauseOfWrites: under CLIENT PAUSE WRITE Redis
// answers reads on every connection not held at a write. With a write held
// on every shared connection (here the only one), a client that only reads
// waited for the pause to end, and past dead_timeout failed (found by a
// probe: a 3 s pause delayed its GETs 3 s, where Redis answered in 8 ms).
// Batches of reads now keep off connections with a write pending, going to
// the pool's spare connection when every one has, from the first read on
// (here right after the held INCR is queued, with no pipe ever lagging);
// a batch with a write still waits for the pause, as on Redis.
func TestReadsAnsweredDuringAPauseOfWrites(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Connections = 1
		// No pipe lags within the test: only a pending write keeps
		// reads off it.
		c.Upstream.ReplyTimeout = units.Duration{Duration: 5 * time.Minute}
		c.Upstream.DeadTimeout = units.Duration{Duration: 5 * time.Minute}
	})
	setup := dialRaw(t, p.Addr)
	for _, k := range []string{"k1", "k2"} {
		if v := setup.do("SET", k, "v-"+k); v != "OK" {
			t.Fatalf("SET %s = %v", k, v)
		}
	}
	direct := rs.Client(t)
	if err := direct.Do(ctx, "CLIENT", "PAUSE", "120000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer direct.ClientUnpause(ctx)
	writer := dialRaw(t, p.Addr)
	writer.send([]string{"INCR", "n"})
	redistest.Eventually(t, 10*time.Second, func() bool {
		return lkGauge(t, p.Metrics.Registry, "redproxy_upstream_queue_depth") >= 1
	}, "the INCR never reached the shared connection")

	reader := dialRaw(t, p.Addr)
	for i := range 20 {
		if v := reader.do("GET", "k1"); v != "v-k1" {
			t.Fatalf("GET %d during the pause = %v", i, v)
		}
	}
	reader.send([]string{"MGET", "k1", "k2"}, []string{"EXISTS", "k1", "k2"}, []string{"STRLEN", "k2"})
	if v, _ := reader.readReply(); len(v.([]any)) != 2 {
		t.Fatalf("MGET during the pause = %v", v)
	}
	if v, _ := reader.readReply(); v != int64(2) {
		t.Fatalf("EXISTS during the pause = %v", v)
	}
	if v, _ := reader.readReply(); v != int64(4) {
		t.Fatalf("STRLEN during the pause = %v", v)
	}
	// The write is still held: Redis has not run it.
	if n, err := direct.Exists(ctx, "n").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS n straight on Redis = %d, %v: the INCR ran during the pause", n, err)
	}
	if err := direct.ClientUnpause(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := writer.readReply(); v != int64(1) {
		t.Fatalf("the held INCR = %v", v)
	}
	if v := reader.do("GET", "n"); v != "1" {
		t.Fatalf("GET n after the INCR's reply = %v", v)
	}
}

// TestClusterReadsAnsweredDuringAPauseOfWrites is
// TestReadsAnsweredDuringAPauseOfWrites in cluster mode, where a failover
// (CLUSTER FAILOVER, FAILOVER) pauses the old primary's writes: reads of
// its keys, alone or in a batch split over nodes, go to its pool's spare
// connection while its shared one waits.
func TestClusterReadsAnsweredDuringAPauseOfWrites(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Upstream.Connections = 1
		cfg.Upstream.ReplyTimeout = units.Duration{Duration: 5 * time.Minute}
		cfg.Upstream.DeadTimeout = units.Duration{Duration: 5 * time.Minute}
	})
	setup := dialRaw(t, p.Addr)
	keys := []string{"p:{t}1", "p:{u}1", "p:{v}1", "p:{w}1"}
	for _, k := range keys {
		if v := setup.do("SET", k, "v"); v != "OK" {
			t.Fatalf("SET %s = %v", k, v)
		}
	}
	var paused *redistest.Server
	for _, n := range c.Primaries(t) {
		if n.Client(t).Exists(ctx, "p:{t}1").Val() == 1 {
			paused = n
		}
	}
	if paused == nil {
		t.Fatal("no primary holds p:{t}1")
	}
	direct := paused.Client(t)
	if err := direct.Do(ctx, "CLIENT", "PAUSE", "120000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer direct.ClientUnpause(ctx)
	writer := dialRaw(t, p.Addr)
	writer.send([]string{"INCR", "p:{t}n"})
	redistest.Eventually(t, 10*time.Second, func() bool {
		return lkGauge(t, p.Metrics.Registry, "redproxy_upstream_queue_depth") >= 1
	}, "the INCR never reached the node's shared connection")

	reader := dialRaw(t, p.Addr)
	for i := range 10 {
		if v := reader.do("GET", "p:{t}1"); v != "v" {
			t.Fatalf("GET %d during the pause = %v", i, v)
		}
	}
	if v, ok := reader.do(append([]string{"MGET"}, keys...)...).([]any); !ok || len(v) != len(keys) {
		t.Fatalf("MGET over the nodes during the pause = %v", v)
	}
	if err := direct.ClientUnpause(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := writer.readReply(); v != int64(1) {
		t.Fatalf("the held INCR = %v", v)
	}
}
