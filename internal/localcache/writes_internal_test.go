package localcache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// liveCache is a tier admitting every key on its first read, over a new
// redis-server, with DB 0's fill connection live.
func liveCache(t *testing.T) (*Cache, *redistest.Server) {
	t.Helper()
	rs := redistest.Start(t)
	cfg := DefaultConfig()
	cfg.Enabled = true
	cfg.AdmitMinReads = 0
	cfg.WriteRatio = 1000 // the tests write before they read
	cfg.Staleness = units.Duration{Duration: time.Second}
	c, err := New(cfg, Options{Upstream: func(int) upstream.Options { return upstream.Options{Addr: rs.Addr()} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	c.Connect(0)
	redistest.Eventually(t, 10*time.Second, func() bool { return c.Live(0) }, "DB 0 never became live")
	return c, rs
}

// A write to a key the tier holds nothing of keeps no record for it (the
// shard's writing filter stands in), yet until its reply no read of the
// key is served or filled: a fill sent meanwhile could read the value from
// before the write and keep it after the writer got OK (C3).
func TestWriteToUnknownKeyHoldsFills(t *testing.T) {
	c, rs := liveCache(t)
	set, get := commands.Builtin().Get("set"), commands.Builtin().Get("get")
	key := []byte("unknown:1")
	raw := resp.AppendCommandNamed(nil, "GET", key)
	var w Writes
	c.WriteStart(&w, 0, set, [][]byte{[]byte("SET"), key, []byte("v")}, false)
	if !w.Pending() {
		t.Fatal("the write left nothing for WriteDone")
	}
	s := c.shardOf(c.hash(0, key))
	s.mu.Lock()
	n := len(s.recs)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("the write made %d records; want none for a key the tier does not know", n)
	}
	if _, st := c.Get(0, false, raw, key); st != PassToPrimary {
		t.Fatalf("read during the write: %v, want PassToPrimary", st)
	}
	if _, err := c.Fill(0, false, get, raw, key); !errors.Is(err, ErrNotNow) {
		t.Fatalf("fill during the write: %v, want ErrNotNow", err)
	}
	// The write runs and its reply comes back.
	if err := rs.Client(t).Set(context.Background(), string(key), "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c.WriteDone(&w)
	if _, st := c.Get(0, false, raw, key); st != Fill {
		t.Fatalf("read after the write's reply: %v, want Fill", st)
	}
	if _, err := c.Fill(0, false, get, raw, key); err != nil {
		t.Fatalf("fill after the write's reply: %v", err)
	}
	if _, st := c.Get(0, false, raw, key); st != Hit {
		t.Fatalf("read after the fill: %v, want Hit", st)
	}
}

// What the tier adds to a write of a key it does not hold allocates
// nothing (issue 10: writes must not pay for the tier).
func TestWriteToUnknownKeyAllocatesNothing(t *testing.T) {
	c, _ := liveCache(t)
	set := commands.Builtin().Get("set")
	args := [][]byte{[]byte("SET"), []byte("unknown:2"), []byte("v")}
	var w Writes
	if n := testing.AllocsPerRun(1000, func() {
		c.WriteStart(&w, 0, set, args, false)
		c.WriteDone(&w)
	}); n != 0 {
		t.Fatalf("%v allocations per write, want 0", n)
	}
}
