// Package lintest records GET/SET/DEL/INCR histories of concurrent Redis
// clients and checks them with porcupine against a sequential key-value
// store, per key. The local tier's coherence contract and the cluster
// router's resharding are both checked with it.
package lintest

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

var hashSeed = maphash.MakeSeed()

// In is one operation: its kind, key and, for SET, value.
type In struct {
	Op  byte // 'g' GET, 's' SET, 'd' DEL, 'i' INCR
	Key string
	Val string
}

// Out is the result: the value read ("" for nil), the new INCR value, or
// DEL's count.
type Out struct {
	Val string
	N   int64
}

// Model is a sequential key-value store, partitioned by key.
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(In).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return "" }, // "" is a missing key: SET never writes ""
	Hash: func(state any) uint64 { return maphash.String(hashSeed, state.(string)) },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(In), output.(Out)
		switch in.Op {
		case 'g':
			return out.Val == s, s
		case 's':
			return true, in.Val
		case 'd':
			return (out.N == 1) == (s != ""), ""
		case 'i':
			n := int64(0)
			if s != "" {
				var err error
				if n, err = strconv.ParseInt(s, 10, 64); err != nil {
					return false, s
				}
			}
			return out.N == n+1, strconv.FormatInt(n+1, 10)
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(In), output.(Out)
		return fmt.Sprintf("%c %s %s -> %q %d", in.Op, in.Key, in.Val, out.Val, out.N)
	},
}

// Worker is one client of a recorded history.
type Worker struct {
	C *redis.Client
	// readShift moves a read's start back (C2: a read that starts at t may
	// return anything acknowledged after t − S).
	ReadShift  time.Duration
	WritesOnly bool
	ReadsOnly  bool
	WritePct   int // for clients that read and write: share of writes, in percent (default 40)
	// every paces the Worker (one operation per tick), so a history spans
	// many S instead of being over before the bound means anything.
	Every time.Duration
	// Keys is the prefix of the keys the Worker uses ("lin:" if empty):
	// Workers with prefixes of their own each have a history of their own
	// keys, to check what a single client must see (read-your-writes).
	Keys string
}

// record runs ops operations per Worker on nkeys keys (for paced workers:
// as many as fit in dur) and returns the history. Any error fails the test:
// an operation with an unknown outcome would weaken the check.
func Record(t *testing.T, workers []Worker, nkeys, ops int) []porcupine.Operation {
	return RecordFor(t, workers, nkeys, ops, 0)
}

// RecordFor is Record for paced workers: they run for dur instead of ops.
func RecordFor(t *testing.T, workers []Worker, nkeys, ops int, dur time.Duration) []porcupine.Operation {
	t.Helper()
	base := time.Now()
	var mu sync.Mutex
	var hist []porcupine.Operation
	var wg sync.WaitGroup
	errs := make(chan error, len(workers))
	for id, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(id), 7))
			if w.WritePct == 0 {
				w.WritePct = 40
			}
			var tick <-chan time.Time
			if w.Every > 0 {
				tk := time.NewTicker(w.Every)
				defer tk.Stop()
				tick = tk.C
			}
			for seq := 0; ; seq++ {
				if dur > 0 && time.Since(base) >= dur || dur == 0 && seq == ops {
					return
				}
				if tick != nil {
					<-tick
				}
				prefix := w.Keys
				if prefix == "" {
					prefix = "lin:"
				}
				in := In{Key: prefix + strconv.Itoa(r.IntN(nkeys))}
				x := r.IntN(100)
				switch {
				case w.ReadsOnly:
					in.Op = 'g'
				case w.WritesOnly && x < 50 || !w.WritesOnly && x < w.WritePct/2:
					// Unique, and far from each other so INCRs of one
					// never produce another: reads then name their write.
					in.Op, in.Val = 's', strconv.Itoa((id+1)*1_000_000_000+seq*1000)
				case w.WritesOnly && x < 52 || !w.WritesOnly && x < w.WritePct*11/20:
					in.Op = 'd'
				case w.WritesOnly || x < w.WritePct:
					in.Op = 'i'
				default:
					in.Op = 'g'
				}
				call := time.Since(base)
				var out Out
				var err error
				switch in.Op {
				case 'g':
					out.Val, err = w.C.Get(ctx, in.Key).Result()
					if err == redis.Nil {
						err = nil
					}
				case 's':
					err = w.C.Set(ctx, in.Key, in.Val, 0).Err()
				case 'd':
					out.N, err = w.C.Del(ctx, in.Key).Result()
				case 'i':
					out.N, err = w.C.Incr(ctx, in.Key).Result()
				}
				ret := time.Since(base)
				if err != nil {
					errs <- fmt.Errorf("%c %s: %w", in.Op, in.Key, err)
					return
				}
				if in.Op == 'g' {
					call -= w.ReadShift
				}
				mu.Lock()
				hist = append(hist, porcupine.Operation{ClientId: id, Input: in, Call: int64(call), Output: out, Return: int64(ret)})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return hist
}

// Check checks hist against Model, for at most 20 s, and logs the result.
func Check(t *testing.T, hist []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(Model, hist, 20*time.Second)
	t.Logf("%d operations checked in %v: %v", len(hist), time.Since(start), res)
	return res
}
