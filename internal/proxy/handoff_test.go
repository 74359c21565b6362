package proxy_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Many clients, some sending one GET at a time and some pipelines of GETs,
// share the proxy's two upstream connections while Redis kills those
// connections mid-pipeline. Every client must get its own replies, in
// order: a reply for its command or an upstream error, never another
// client's reply.
func TestSharedPipesKilledMidPipelineNoCrossTalk(t *testing.T) {
	p := proxytest.Start(t, redistest.Start(t, "--enable-debug-command", "local"), nil)
	killer := p.Redis.Client(t)
	const clients, kills, depthMax = 32, 4, 12
	for w := 0; w < clients; w++ {
		for d := 0; d < depthMax; d++ {
			if err := killer.Set(ctx, fmt.Sprintf("k:%d:%d", w, d), fmt.Sprintf("v:%d:%d", w, d), 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	var (
		wg         sync.WaitGroup
		answered   atomic.Int64 // replies that were the client's own
		failed     atomic.Int64 // replies that were upstream errors
		stop       = make(chan struct{})
		afterKills = make(chan struct{})
		errs       = make(chan error, clients)
	)
	for w := 0; w < clients; w++ {
		rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			clean := 0
			for r := 0; ; r++ {
				select {
				case <-stop:
					return
				default:
				}
				depth := 1
				if w%2 == 1 {
					depth = 1 + r%depthMax
				}
				pipe := rc.Pipeline()
				cmds := make([]*redis.StringCmd, depth)
				for d := range cmds {
					cmds[d] = pipe.Get(ctx, fmt.Sprintf("k:%d:%d", w, d))
				}
				pipe.Exec(ctx)
				allOwn := true
				for d, c := range cmds {
					want := fmt.Sprintf("v:%d:%d", w, d)
					switch got, err := c.Result(); {
					case err == nil && got == want:
						answered.Add(1)
					case err != nil && strings.HasPrefix(err.Error(), "ERR redproxy: upstream"):
						failed.Add(1)
						allOwn = false
					default:
						errs <- fmt.Errorf("client %d round %d command %d: got %q, %v; want %q", w, r, d, got, err, want)
						return
					}
				}
				if !allOwn {
					time.Sleep(time.Millisecond) // the pipes are redialing
					continue
				}
				select {
				case <-afterKills:
					if clean++; clean == 20 {
						return
					}
				default:
				}
			}
		}(w)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	fail := func(err error) {
		close(stop)
		<-done
		t.Fatal(err)
	}
	for k := 0; k < kills; k++ {
		base := answered.Load()
		redistest.Eventually(t, 10*time.Second, func() bool { return len(errs) > 0 || answered.Load() >= base+500 }, "no progress before kill %d", k)
		if len(errs) > 0 {
			fail(<-errs)
		}
		// Redis sleeps while the proxy keeps writing, then kills its
		// connections before reading what they sent meanwhile: the
		// commands in flight fail.
		pipe := killer.Pipeline()
		pipe.Do(ctx, "DEBUG", "SLEEP", "0.02")
		kill := pipe.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if n, _ := kill.Int(); n == 0 {
			t.Fatal("CLIENT KILL found no connection of the proxy")
		}
	}
	close(afterKills)
	select {
	case <-done:
	case err := <-errs:
		fail(err)
	case <-time.After(30 * time.Second):
		fail(fmt.Errorf("clients were not served again after the last kill"))
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if failed.Load() == 0 {
		t.Fatalf("no command failed: the kills did not land mid-pipeline (%d answered)", answered.Load())
	}
	t.Logf("%d replies answered, %d upstream errors after %d kills", answered.Load(), failed.Load(), kills)
}
