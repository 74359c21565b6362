package proxy_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/lintest"
)

// rfRecord runs workers for dur, each issuing GET/SET/DEL/INCR on nkeys
// keys named prefix+i, and returns the history. Unlike lintest.Record it
// tolerates errors, as a client under faults must: a write whose reply was
// an error is "maybe applied" (pending forever, Return = +inf); a read that
// failed is left out. Only a wrong value can fail the check.
func rfRecord(t *testing.T, clients []*redis.Client, prefix string, nkeys int, dur time.Duration, delOK, ownKeys bool) (hist []porcupine.Operation, errs int) {
	t.Helper()
	base := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx := context.Background()
	for id, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(id), 11))
			tk := time.NewTicker(2 * time.Millisecond)
			defer tk.Stop()
			for seq := 0; time.Since(base) < dur; seq++ {
				<-tk.C
				in := lintest.In{Key: prefix + strconv.Itoa(r.IntN(nkeys))}
				if ownKeys {
					in.Key = prefix + strconv.Itoa(id) + ":" + strconv.Itoa(r.IntN(nkeys))
				}
				x := r.IntN(100)
				switch {
				case x < 30:
					in.Op, in.Val = 's', strconv.Itoa((id+1)*1_000_000_000+seq*1000)
				case x < 33 && delOK:
					in.Op = 'd'
				default:
					in.Op = 'g'
				}
				call := time.Since(base)
				var out lintest.Out
				var err error
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				switch in.Op {
				case 'g':
					out.Val, err = c.Get(cctx, in.Key).Result()
					if err == redis.Nil {
						err = nil
					}
				case 's':
					err = c.Set(cctx, in.Key, in.Val, 0).Err()
				case 'd':
					out.N, err = c.Del(cctx, in.Key).Result()
				case 'i':
					out.N, err = c.Incr(cctx, in.Key).Result()
				}
				cancel()
				ret := time.Since(base)
				if err != nil && strings.Contains(err.Error(), "not an integer") {
					err = nil // a DEL/SET race turning INCR's key into a string: cannot happen, values are numbers
				}
				mu.Lock()
				if err != nil {
					errs++
					if in.Op != 'g' {
						// Unknown outcome: may take effect at any time
						// after the call. Its output is unknowable, so
						// only SET (whose output is nothing) is kept.
						if in.Op == 's' {
							hist = append(hist, porcupine.Operation{ClientId: id, Input: in, Call: int64(call), Output: out, Return: math.MaxInt64})
						} else {
							// DEL/INCR with an unknown outcome: model as a
							// SET of an unknown value is impossible, so
							// stop this client to keep the history sound
							// for the keys it touched... simpler: record
							// nothing and mark the key as tainted.
							taint(in.Key)
						}
					}
					mu.Unlock()
					if strings.Contains(err.Error(), "connection refused") {
						time.Sleep(5 * time.Millisecond)
					}
					continue
				}
				hist = append(hist, porcupine.Operation{ClientId: id, Input: in, Call: int64(call), Output: out, Return: int64(ret)})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return hist, errs
}

var (
	taintMu sync.Mutex
	tainted = map[string]bool{}
)

func taint(k string) {
	taintMu.Lock()
	tainted[k] = true
	taintMu.Unlock()
}

// rfCheck checks hist, leaving out keys a DEL or INCR of unknown outcome
// touched (the model cannot say what they did).
func rfCheck(t *testing.T, hist []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	taintMu.Lock()
	var kept []porcupine.Operation
	for _, op := range hist {
		if !tainted[op.Input.(lintest.In).Key] {
			kept = append(kept, op)
		}
	}
	n := len(tainted)
	clear(tainted)
	taintMu.Unlock()
	t.Logf("%d keys left out (DEL/INCR of unknown outcome)", n)
	res, info := porcupine.CheckOperationsVerbose(lintest.Model, kept, 30*time.Second)
	if res == porcupine.Illegal {
		path := fmt.Sprintf("/tmp/rf-%s.html", strings.ReplaceAll(t.Name(), "/", "_"))
		if err := porcupine.VisualizePath(lintest.Model, info, path); err == nil {
			t.Logf("visualization: %s", path)
		}
	}
	t.Logf("%d operations checked: %v", len(kept), res)
	return res
}

func strconvFormat(n int64) string { return strconv.FormatInt(n, 10) }
