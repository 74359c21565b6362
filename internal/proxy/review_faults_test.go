package proxy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// rfKillNamed kills, on Redis, the connections whose CLIENT LIST line
// contains match (e.g. " name=redproxy-tier "); "" kills every other one.
func rfKillNamed(t *testing.T, direct *redis.Client, match string) int {
	list, err := direct.ClientList(context.Background()).Result()
	if err != nil {
		return 0
	}
	me, _ := direct.ClientID(context.Background()).Result()
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if match != "" && !strings.Contains(line, match) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				if id == itoa64(me) {
					continue
				}
				if direct.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err() == nil {
					n++
				}
			}
		}
	}
	return n
}

func itoa64(n int64) string { return strconvFormat(n) }

type rfFault int

const (
	rfKillAll rfFault = iota
	rfKillTier
	rfFreeze
	rfPauseWrite
	rfPauseAll
	rfRestart
)

// rfFaults runs faults against rs until stop is closed.
func rfFaults(t *testing.T, rs *redistest.Server, kinds []rfFault, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	direct := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: 3})
	defer direct.Close()
	r := rand.New(rand.NewPCG(1, 2))
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(100+r.IntN(200)) * time.Millisecond):
		}
		switch kinds[r.IntN(len(kinds))] {
		case rfKillAll:
			rfKillNamed(t, direct, "")
		case rfKillTier:
			rfKillNamed(t, direct, " name=redproxy-tier ")
		case rfFreeze:
			rs.Freeze(t)
			time.Sleep(time.Duration(100+r.IntN(400)) * time.Millisecond)
			rs.Thaw(t)
		case rfPauseWrite:
			direct.Do(context.Background(), "CLIENT", "PAUSE", 300, "WRITE")
		case rfPauseAll:
			direct.Do(context.Background(), "CLIENT", "PAUSE", 300, "ALL")
		case rfRestart:
			rs.Restart(t)
		}
	}
}

func rfTierProxy(t *testing.T, rs *redistest.Server, mutate func(*config.Config)) *proxytest.Proxy {
	return proxytest.Start(t, rs, func(c *config.Config) {
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.WriteRatio = 1000
		c.LocalCache.Staleness = units.Duration{Duration: 200 * time.Millisecond}
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
		c.Upstream.ReplyTimeout = units.Duration{Duration: 100 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: time.Second}
		c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		if mutate != nil {
			mutate(c)
		}
	})
}

func rfRun(t *testing.T, p *proxytest.Proxy, rs *redistest.Server, kinds []rfFault, nclients int, dur time.Duration, delOK, ownKeys bool) {
	var clients []*redis.Client
	for range nclients {
		clients = append(clients, p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.ReadTimeout = 20 * time.Second }))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go rfFaults(t, rs, kinds, stop, &wg)
	hist, errs := rfRecord(t, clients, "lin:", 16, dur, delOK, ownKeys)
	close(stop)
	wg.Wait()
	t.Logf("%d operations, %d errors", len(hist), errs)
	if res := rfCheck(t, hist); res == porcupine.Illegal {
		t.Fatalf("history is not linearizable")
	}
}

func TestReviewFaultsTierKills(t *testing.T) {
	rs := redistest.Start(t)
	p := rfTierProxy(t, rs, nil)
	rfRun(t, p, rs, []rfFault{rfKillAll, rfKillTier}, 8, 4*time.Second, false, false)
}

func TestReviewFaultsTierFreeze(t *testing.T) {
	rs := redistest.Start(t)
	p := rfTierProxy(t, rs, nil)
	rfRun(t, p, rs, []rfFault{rfFreeze, rfPauseWrite, rfPauseAll}, 8, 4*time.Second, false, false)
}

func rfHold(c *config.Config) {
	c.Stampede.Hold = append(c.Stampede.Hold, stampede.HoldRule{Pattern: "lin:*", Timeout: units.Duration{Duration: 300 * time.Millisecond}})
}

func TestReviewFaultsTierHoldKills(t *testing.T) {
	rs := redistest.Start(t)
	p := rfTierProxy(t, rs, rfHold)
	rfRun(t, p, rs, []rfFault{rfKillAll, rfKillTier}, 8, 4*time.Second, true, false)
}

func TestReviewFaultsTierHoldFreeze(t *testing.T) {
	rs := redistest.Start(t)
	p := rfTierProxy(t, rs, rfHold)
	rfRun(t, p, rs, []rfFault{rfFreeze, rfPauseWrite, rfPauseAll, rfKillAll}, 8, 4*time.Second, true, false)
}

// rfReplicaFaults runs faults on the replicas (and, sometimes, kills the
// proxy's connections on the primary) until stop is closed.
func rfReplicaFaults(t *testing.T, g *replicated, restart bool, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	r := rand.New(rand.NewPCG(3, 4))
	pdirect := redis.NewClient(&redis.Options{Addr: g.primary.Addr(), MaxRetries: 3})
	defer pdirect.Close()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(100+r.IntN(200)) * time.Millisecond):
		}
		rep := g.replicas[r.IntN(len(g.replicas))]
		switch x := r.IntN(5); {
		case x == 0:
			d := redis.NewClient(&redis.Options{Addr: rep.Addr()})
			rfKillNamed(t, d, " flags=N ")
			d.Close()
		case x == 1:
			rep.Freeze(t)
			time.Sleep(time.Duration(100+r.IntN(600)) * time.Millisecond)
			rep.Thaw(t)
		case x == 2 && restart:
			rep.Restart(t)
		case x == 3:
			rfKillNamed(t, pdirect, " flags=N ")
		default:
			d := redis.NewClient(&redis.Options{Addr: rep.Addr()})
			d.Do(context.Background(), "CLIENT", "PAUSE", 300, "ALL")
			d.Close()
		}
	}
}

func rfReplicaRun(t *testing.T, tier, restart bool) {
	g := startReplicated(t, 2)
	p := g.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		c.Upstream.ReplyTimeout = units.Duration{Duration: 100 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: time.Second}
		c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		if tier {
			c.LocalCache.Enabled = true
			c.LocalCache.AdmitMinReads = 0
			c.LocalCache.WriteRatio = 1000
			c.LocalCache.Staleness = units.Duration{Duration: 200 * time.Millisecond}
		}
	})
	var clients []*redis.Client
	for range 8 {
		clients = append(clients, p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.ReadTimeout = 20 * time.Second }))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go rfReplicaFaults(t, g, restart, stop, &wg)
	hist, errs := rfRecord(t, clients, "ryw:", 4, 5*time.Second, true, true)
	close(stop)
	wg.Wait()
	t.Logf("%d operations, %d errors", len(hist), errs)
	if res := rfCheck(t, hist); res == porcupine.Illegal {
		t.Fatalf("a client did not read its own writes")
	}
}

func TestReviewFaultsReplicaRYW(t *testing.T)        { rfReplicaRun(t, false, false) }
func TestReviewFaultsReplicaRYWRestart(t *testing.T) { rfReplicaRun(t, false, true) }
func TestReviewFaultsReplicaTierRYW(t *testing.T)    { rfReplicaRun(t, true, true) }

// rfPipeliner sends pipelines of n mixed commands on its own keys and
// checks each reply against what the client itself acknowledged before.
// A write that failed (a reply timeout, a lost connection) has an unknown
// outcome: it may take effect at any later time, after writes the client
// sent and saw acknowledged later (it may sit in a frozen Redis's socket
// buffer; so it may on Redis directly, after a client-side timeout), or
// never. So: a GET returns the last acknowledged SET's value or that of a
// SET that failed; INCR results only grow, each by 1 plus increments of
// failed INCRs and transactions not yet seen landing (a transaction's two
// land together); a transaction (MULTI INCR INCR EXEC) that EXEC answered
// applied both.
func rfPipeliner(t *testing.T, c *redis.Client, id int, n int, stop <-chan struct{}, bad chan<- string) (sent, failed int) {
	ctx := context.Background()
	sk := "pp:" + strconv.Itoa(id) + ":s"
	ck := "pp:" + strconv.Itoa(id) + ":c"
	val := ""                            // the last acknowledged SET's value
	mayLand := map[string]bool{"": true} // values of SETs that failed (and "": none yet)
	var counter int64                    // last INCR value seen
	unknownIncr := int64(0)              // increments of failed INCRs not yet seen landing
	r := rand.New(rand.NewPCG(uint64(id), 9))
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		type exp struct {
			kind  byte
			val   string
			known bool
		}
		pipe := c.Pipeline()
		var cmds []redis.Cmder
		var exps []exp
		for i := 0; i < n; i++ {
			switch x := r.IntN(10); {
			case x < 3:
				v := strconv.Itoa(seq*100000 + i)
				cmds = append(cmds, pipe.Set(ctx, sk, v, 0))
				exps = append(exps, exp{kind: 's', val: v})
			case x < 6:
				cmds = append(cmds, pipe.Get(ctx, sk))
				exps = append(exps, exp{kind: 'g'})
			case x < 8:
				cmds = append(cmds, pipe.Incr(ctx, ck))
				exps = append(exps, exp{kind: 'i'})
			case x < 9:
				cmds = append(cmds, pipe.Do(ctx, "MULTI"), pipe.Do(ctx, "INCR", ck), pipe.Do(ctx, "INCR", ck), pipe.Do(ctx, "EXEC"))
				exps = append(exps, exp{kind: 'M'}, exp{kind: 'q'}, exp{kind: 'q'}, exp{kind: 'E'})
				i += 3
			default:
				e := "e" + strconv.Itoa(i)
				cmds = append(cmds, pipe.Echo(ctx, e))
				exps = append(exps, exp{kind: 'e', val: e})
			}
		}
		_, _ = pipe.Exec(ctx)
		sent += len(cmds)
		for i, cmd := range cmds {
			e := exps[i]
			err := cmd.Err()
			if e.kind == 'M' || e.kind == 'q' {
				continue
			}
			if err != nil && err != redis.Nil {
				failed++
				if !strings.Contains(err.Error(), "redproxy") && !strings.Contains(err.Error(), "EXECABORT") && !strings.Contains(err.Error(), "BUSY") {
					report(bad, fmt.Sprintf("client %d cmd %d (%c): unexpected error %v", id, i, e.kind, err))
				}
				switch e.kind {
				case 's':
					mayLand[e.val] = true
				case 'i':
					unknownIncr++
				case 'E':
					unknownIncr += 2
				}
				continue
			}
			switch e.kind {
			case 's':
				val = e.val
			case 'g':
				v, _ := cmd.(*redis.StringCmd).Result()
				if v != val && !mayLand[v] {
					report(bad, fmt.Sprintf("client %d seq %d cmd %d: GET %s = %q, its last acknowledged SET wrote %q and no SET of that value failed", id, seq, i, sk, v, val))
				}
			case 'i':
				got := cmd.(*redis.IntCmd).Val()
				landed := got - counter - 1
				if landed < 0 || landed > unknownIncr {
					report(bad, fmt.Sprintf("client %d seq %d cmd %d: INCR = %d after %d with %d unknown", id, seq, i, got, counter, unknownIncr))
				}
				counter, unknownIncr = got, max(0, unknownIncr-landed)
			case 'E':
				res, ok := cmd.(*redis.Cmd).Val().([]any)
				if !ok || len(res) != 2 {
					report(bad, fmt.Sprintf("client %d seq %d cmd %d: EXEC = %#v", id, seq, i, cmd.(*redis.Cmd).Val()))
					unknownIncr += 2
					continue
				}
				a, _ := res[0].(int64)
				b, _ := res[1].(int64)
				landed := a - counter - 1
				if b != a+1 || landed < 0 || landed > unknownIncr {
					report(bad, fmt.Sprintf("client %d seq %d cmd %d: EXEC = [%d %d] after %d with %d unknown", id, seq, i, a, b, counter, unknownIncr))
				}
				counter, unknownIncr = b, max(0, unknownIncr-landed)
			case 'e':
				if v := cmd.(*redis.StringCmd).Val(); v != e.val {
					report(bad, fmt.Sprintf("client %d seq %d cmd %d: ECHO = %q, want %q", id, seq, i, v, e.val))
				}
			}
		}
	}
}

func rfPipelines(t *testing.T, p *proxytest.Proxy, rs *redistest.Server, kinds []rfFault) {
	stop := make(chan struct{})
	bad := make(chan string, 1000)
	var wg, fw sync.WaitGroup
	var mu sync.Mutex
	total, totalFailed := 0, 0
	for id := range 4 {
		c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.ReadTimeout = 20 * time.Second })
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, f := rfPipeliner(t, c, id, 1000, stop, bad)
			mu.Lock()
			total += s
			totalFailed += f
			mu.Unlock()
		}()
	}
	fw.Add(1)
	go rfFaults(t, rs, kinds, stop, &fw)
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	fw.Wait()
	close(bad)
	t.Logf("%d commands, %d failed", total, totalFailed)
	n := 0
	for b := range bad {
		if n < 20 {
			t.Error(b)
		}
		n++
	}
}

func TestReviewFaultsPipelinesTier(t *testing.T) {
	rs := redistest.Start(t)
	p := rfTierProxy(t, rs, rfHold)
	rfPipelines(t, p, rs, []rfFault{rfKillAll, rfKillTier, rfFreeze})
}

func TestReviewFaultsPipelinesPlain(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.ReplyTimeout = units.Duration{Duration: 100 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 300 * time.Millisecond}
	})
	rfPipelines(t, p, rs, []rfFault{rfKillAll, rfFreeze, rfPauseWrite})
}

func report(bad chan<- string, s string) {
	select {
	case bad <- s:
	default:
	}
}

// Redis restarted with persistence (AOF, fsync always: no acknowledged
// write is lost by Redis itself), the local tier and miss holds on.
func TestReviewFaultsTierRestartPersistent(t *testing.T) {
	rs := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	p := rfTierProxy(t, rs, rfHold)
	rfRun(t, p, rs, []rfFault{rfRestart, rfKillTier}, 8, 5*time.Second, false, false)
}

// A replica promoted behind the proxy's back (REPLICAOF NO ONE: it keeps
// its data and stops following the primary). Reads of another client's
// writes must not keep coming from it: once max_replica_lag (plus a poll)
// has passed, every read shows a value at least as new as the primary
// had max_replica_lag before.
func TestReviewFaultsReplicaPromotedBehindProxy(t *testing.T) {
	g := startReplicated(t, 1)
	p := g.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 200 * time.Millisecond}
	})
	ctx := context.Background()
	w, r := p.Client(t), p.Client(t)
	for i := range 50 {
		w.Set(ctx, "pk", strconv.Itoa(i), 0)
	}
	time.Sleep(300 * time.Millisecond)
	rep := g.replicas[0].Client(t)
	if err := rep.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.Set(ctx, "pk", "after", 0).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stale := 0
	for range 50 {
		v, err := r.Get(ctx, "pk").Result()
		if err != nil {
			t.Fatal(err)
		}
		if v != "after" {
			stale++
		}
	}
	if stale > 0 {
		t.Fatalf("%d of 50 reads, 1s after the write, returned the promoted replica's old value", stale)
	}
}

// Miss hold: the filler got nil, readers are held; the proxy's upstream
// connections are killed while the filler writes. Every held reader must be
// released within the hold's timeout with the key's own value (or nil),
// never another key's.
func TestReviewFaultsHoldFillerConnKilled(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Stampede.Hold = append(c.Stampede.Hold, stampede.HoldRule{Pattern: "h:*", Timeout: units.Duration{Duration: time.Second}})
	})
	ctx := context.Background()
	direct := rs.Client(t)
	for round := range 10 {
		key := "h:" + strconv.Itoa(round)
		filler := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		redistest.Eventually(t, 5*time.Second, func() bool { return filler.Get(ctx, key).Err() == redis.Nil }, "filler's GET never answered nil")
		var wg sync.WaitGroup
		res := make(chan string, 20)
		for range 20 {
			c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				v, err := c.Get(ctx, key).Result()
				if err != nil && err != redis.Nil {
					v = "err:" + err.Error()
				}
				if time.Since(start) > 3*time.Second {
					v = "late:" + v
				}
				res <- v
			}()
		}
		time.Sleep(50 * time.Millisecond)
		// other keys' traffic, so a crossed reply would show
		other := p.Client(t)
		other.Set(ctx, "h:other", "OTHER", 0)
		go rfKillNamed(t, direct, "")
		filler.Set(ctx, key, "v"+strconv.Itoa(round), 0)
		wg.Wait()
		close(res)
		for v := range res {
			if v != "v"+strconv.Itoa(round) && v != "" && !strings.HasPrefix(v, "err:") {
				t.Errorf("round %d: held reader got %q", round, v)
			}
		}
	}
}
