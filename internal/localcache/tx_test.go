package localcache_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// slowInvalidations delays every invalidation push, so a test only passes
// if the tier waits for it (a fence) rather than racing it.
func slowInvalidations() *localcache.TestHooks {
	return &localcache.TestHooks{BeforePush: func() { time.Sleep(20 * time.Millisecond) }}
}

// scriptWrites runs n rounds of: cache k, write it through the proxy with
// write, and read it back from the same client and another one; it returns
// the first round whose read was stale.
func scriptWrites(t *testing.T, p *proxytest.Proxy, n int, write func(c *redis.Client, v string) error) (round int, got, want string) {
	c, other := p.Client(t), p.Client(t)
	for i := range n {
		want = "v" + strconv.Itoa(i)
		cacheIt(t, p, c, "k")
		if err := write(c, want); err != nil {
			t.Fatal(err)
		}
		for _, cl := range []*redis.Client{c, other} {
			if got = mustGet(t, cl, "k"); got != want {
				return i, got, want
			}
		}
	}
	return -1, "", ""
}

var (
	declared   = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)
	undeclared = redis.NewScript(`return redis.call('SET', 'k', ARGV[1])`)
)

// Scripts and transactions writing cached keys through the proxy, with
// invalidations slowed down: every write is visible to the next read,
// through the tier, of the writer and of anyone else (C1, C3).
func TestScriptsAndTransactions(t *testing.T) {
	withHooks(t, slowInvalidations())
	p := startTier(t, nil)
	p.Redis.Client(t).Set(ctx, "k", "start", 0)
	cases := []struct {
		name  string
		write func(c *redis.Client, v string) error
	}{
		{"EVAL declared key", func(c *redis.Client, v string) error {
			return declared.Eval(ctx, c, []string{"k"}, v).Err()
		}},
		{"EVAL undeclared key", func(c *redis.Client, v string) error {
			return undeclared.Eval(ctx, c, nil, v).Err()
		}},
		{"EVALSHA undeclared key", func(c *redis.Client, v string) error {
			return undeclared.Run(ctx, c, nil, v).Err()
		}},
		{"MULTI SET", func(c *redis.Client, v string) error {
			_, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error { tx.Set(ctx, "k", v, 0); return nil })
			return err
		}},
		{"MULTI EVAL undeclared key", func(c *redis.Client, v string) error {
			_, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
				undeclared.Eval(ctx, tx, nil, v)
				return nil
			})
			return err
		}},
		{"WATCH EVAL undeclared key", func(c *redis.Client, v string) error {
			return c.Watch(ctx, func(tx *redis.Tx) error { return undeclared.Eval(ctx, tx, nil, v).Err() }, "k")
		}},
		{"WATCH SET", func(c *redis.Client, v string) error {
			return c.Watch(ctx, func(tx *redis.Tx) error {
				_, err := tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error { pipe.Set(ctx, "k", v, 0); return nil })
				return err
			}, "k")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if i, got, want := scriptWrites(t, p, 20, tc.write); i >= 0 {
				t.Fatalf("round %d: read %q after writing %q", i, got, want)
			}
		})
	}
}

// Without the fence, a script writing a key it did not declare leaves the
// old value in the tier until the (slow) invalidation arrives: the same
// check must fail.
func TestScriptCheckCatchesMissingFence(t *testing.T) {
	h := slowInvalidations()
	h.SkipFences = true
	withHooks(t, h)
	p := startTier(t, nil)
	p.Redis.Client(t).Set(ctx, "k", "start", 0)
	i, _, _ := scriptWrites(t, p, 30, func(c *redis.Client, v string) error {
		return undeclared.Eval(ctx, c, nil, v).Err()
	})
	if i < 0 {
		t.Fatal("a tier without fences passed the undeclared-key script check")
	}
}

// WATCH compare-and-set loops through the proxy end with the exact count,
// while other clients keep reading the key through the tier.
func TestWatchIncrementLoops(t *testing.T) {
	p := startTier(t, nil)
	const workers, each = 4, 50
	direct := p.Redis.Client(t)
	direct.Set(ctx, "counter", "0", 0)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 4 {
		c := p.Client(t)
		readers.Add(1)
		go func() {
			defer readers.Done()
			last := -1
			for {
				select {
				case <-stop:
					return
				default:
				}
				v, err := c.Get(ctx, "counter").Int()
				if err != nil {
					t.Errorf("GET counter: %v", err)
					return
				}
				// One client's reads never go backwards (C1 implies it).
				if v < last {
					t.Errorf("counter went back from %d to %d", last, v)
					return
				}
				last = v
			}
		}()
	}
	var wg sync.WaitGroup
	for range workers {
		c := p.Client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				for {
					err := c.Watch(ctx, func(tx *redis.Tx) error {
						n, err := tx.Get(ctx, "counter").Int()
						if err != nil {
							return err
						}
						_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
							pipe.Set(ctx, "counter", n+1, 0)
							return nil
						})
						return err
					}, "counter")
					if err == nil {
						break
					}
					if err != redis.TxFailedErr {
						t.Errorf("WATCH loop: %v", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	want := strconv.Itoa(workers * each)
	if v := mustGet(t, p.Client(t), "counter"); v != want {
		t.Fatalf("counter through the proxy = %s, want %s", v, want)
	}
	if v, _ := direct.Get(ctx, "counter").Result(); v != want {
		t.Fatalf("counter in Redis = %s, want %s", v, want)
	}
	if hits(t, p) == 0 {
		t.Fatal("the readers were never served from the tier")
	}
}

// A transaction's writes are marked in the session's database when EXEC
// is sent; a SELECT queued before them moves them to another, where only
// a fence keeps the tier from serving what they replaced until the (slow)
// invalidation arrives. Without a SELECT the keys named are enough, and
// no fence pauses every client's hits.
func TestTransactionFencesOnlyWithASelect(t *testing.T) {
	withHooks(t, slowInvalidations())
	p := startTier(t, nil)
	db1 := p.Client(t, func(o *redis.Options) { o.DB = 1 })
	writer := p.Client(t)
	fences := func() float64 { return metric(t, p.Metrics.Registry, "redproxy_localcache_fences_total") }
	for i := range 10 {
		want := "v" + strconv.Itoa(i)
		db1.Set(ctx, "k", "old", 0)
		cacheIt(t, p, db1, "k")
		_, err := writer.TxPipelined(ctx, func(tx redis.Pipeliner) error {
			tx.Select(ctx, 1)
			tx.Set(ctx, "k", want, 0)
			tx.Select(ctx, 0)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, db1, "k"); got != want {
			t.Fatalf("round %d: db 1 read %q after a transaction selecting it wrote %q", i, got, want)
		}
	}
	writer.Set(ctx, "k0", "0", 0)
	before := fences()
	for i := range 10 {
		cacheIt(t, p, writer, "k0")
		if _, err := writer.TxPipelined(ctx, func(tx redis.Pipeliner) error { tx.Incr(ctx, "k0"); return nil }); err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, writer, "k0"); got != strconv.Itoa(i+1) {
			t.Fatalf("round %d: read %q after INCR in MULTI, want %d", i, got, i+1)
		}
	}
	if n := fences() - before; n != 0 {
		t.Fatalf("10 transactions without SELECT raised %v fences, want 0", n)
	}
}
