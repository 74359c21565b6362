package guard_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// placedProxy is a proxy that places a transaction's commands itself,
// and a client straight to where the test's keys (l:*, s:*) live.
type placedProxy struct {
	p      *proxytest.Proxy
	direct redis.UniversalClient
}

// Cluster mode holds a MULTI until its first keyed command and pins it
// there; routes hold it to EXEC and send it whole. A transaction typed
// command by command is checked as a whole in both, as on a single Redis
// (TestTransactionByStepSettlesTTL, TestTransactionByStepDefaults): before,
// each batch was checked alone, so a limiter's INCR + EXPIRE NX got the
// rule's default and a lock's SET + PEXPIRE was refused at the SET.
func TestTransactionByStepPlaced(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
			cfg.Upstream.Mode = config.ModeCluster
			cfg.Upstream.Seeds = c.Seeds()
			cfg.Policy = holesPolicy()
		})
		transactionByStepPlaced(t, placedProxy{p, c.ClusterClient(t)})
	})
	t.Run("routes", func(t *testing.T) {
		def, q := redistest.Start(t), redistest.Start(t)
		p := proxytest.Start(t, def, func(cfg *config.Config) {
			u := config.Default().Upstream
			u.Address = q.Addr()
			cfg.Upstreams = map[string]config.Upstream{"q": u}
			cfg.Routes = []config.Route{{Pattern: "l:*", Upstream: "q"}, {Pattern: "s:*", Upstream: "q"}}
			cfg.Policy = holesPolicy()
		})
		pp := placedProxy{p, q.Client(t)}
		transactionByStepPlaced(t, pp)
		// A key of another upstream fails the transaction at once; the
		// write's requirement is recorded once, at EXEC.
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:x1", "v"}, "+QUEUED"},
			step{[]string{"SET", "other:x", "v"}, "-CROSSROUTE..."},
			step{[]string{"EXEC"}, "-EXECABORT Transaction discarded because of previous errors."})
		if n := pp.direct.Exists(ctx, "l:x1").Val() + def.Client(t).Exists(ctx, "other:x").Val(); n != 0 {
			t.Errorf("%d keys of the failed transaction written", n)
		}
		// Under WATCH, the transaction held on the WATCH's connection.
		steps(t, p,
			step{[]string{"WATCH", "l:w"}, "+OK"},
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:w", "v"}, "+QUEUED"},
			step{[]string{"PEXPIRE", "l:w", "60000"}, "+QUEUED"},
			step{[]string{"EXEC"}, "*[+OK :1]"})
		pp.wantTTL(t, "l:w", time.Minute)
	})
}

// Under report mode a held transaction's open requirement is recorded
// once, whatever ends it (EXEC, RESET, the client gone), and EXEC runs it.
func TestTransactionByStepHeldReported(t *testing.T) {
	def, q := redistest.Start(t), redistest.Start(t)
	pol := holesPolicy()
	pol.Mode = "report"
	p := proxytest.Start(t, def, func(cfg *config.Config) {
		u := config.Default().Upstream
		u.Address = q.Addr()
		cfg.Upstreams = map[string]config.Upstream{"q": u}
		cfg.Routes = []config.Route{{Pattern: "l:*", Upstream: "q"}}
		cfg.Policy = pol
	})
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:r1", "v"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+OK]"},
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:r2", "v"}, "+QUEUED"},
		step{[]string{"RESET"}, "+RESET"})
	nc := p.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}), []string{"+OK"})
	equalReplies(t, roundTrip(t, nc, []string{"SET", "l:r3", "v"}), []string{"+QUEUED"})
	nc.Close()
	if n := q.Client(t).Exists(ctx, "l:r1").Val(); n != 1 {
		t.Errorf("EXEC under report mode did not run the write")
	}
	count := func() (n, reported int64) {
		for _, r := range reportJSON(t, p.Guard()).Rows {
			if r.Rule == policy.RuleTTL && r.Command == "set" {
				n, reported = n+r.Count, reported+r.Reported
			}
		}
		return n, reported
	}
	redistest.Eventually(t, 5*time.Second, func() bool { n, _ := count(); return n >= 3 }, "three set rows recorded")
	if n, reported := count(); n != 3 || reported != 3 {
		t.Errorf("set rows: %d recorded, %d reported; want 3 and 3", n, reported)
	}
}

func (pp placedProxy) wantTTL(t *testing.T, key string, want time.Duration) {
	t.Helper()
	got, err := pp.direct.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if got > want || got <= want-5*time.Second {
		t.Errorf("PTTL %s = %v, want about %v", key, got, want)
	}
}

func transactionByStepPlaced(t *testing.T, pp placedProxy) {
	p := pp.p
	const abort = `-EXECABORT Transaction discarded because of: redproxy policy: key "`

	// A lock: SET, then its TTL in the next command.
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:lock", "v"}, "+QUEUED"},
		step{[]string{"PEXPIRE", "l:lock", "30000"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+OK :1]"})
	pp.wantTTL(t, "l:lock", 30*time.Second)

	// A limiter under a rule with a default keeps its own window.
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"INCR", "s:limit"}, "+QUEUED"},
		step{[]string{"EXPIRE", "s:limit", "60", "NX"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[:1 :1]"})
	pp.wantTTL(t, "s:limit", time.Minute)

	// A keyless command first (cluster: held until the SET places it).
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"PING"}, "+QUEUED"},
		step{[]string{"SET", "l:after", "v"}, "+QUEUED"},
		step{[]string{"EXPIRE", "l:after", "60"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+PONG +OK :1]"})
	pp.wantTTL(t, "l:after", time.Minute)

	// Left open to EXEC: fixed there (the fix-up's result cut from
	// EXEC's reply) or, without a default, refused with nothing run.
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"HSET", "s:{f}fixed", "f", "v"}, "+QUEUED"},
		step{[]string{"GET", "s:{f}other"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[:1 $(nil)]"})
	pp.wantTTL(t, "s:{f}fixed", 24*time.Hour)
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:{n}never", "v"}, "+QUEUED"},
		step{[]string{"INCR", "l:{n}never2"}, "+QUEUED"},
		step{[]string{"EXPIRE", "l:{n}never2", "60"}, "+QUEUED"},
		step{[]string{"EXEC"}, abort + `l:{n}never" needs a TTL...`},
		// Nothing left over for the next transaction.
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:next", "v", "EX", "60"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+OK]"})
	if n := pp.direct.Exists(ctx, "l:{n}never").Val() + pp.direct.Exists(ctx, "l:{n}never2").Val(); n != 0 {
		t.Errorf("the refused transaction wrote %d keys", n)
	}

	// Ended by DISCARD: recorded once, nothing sent.
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"HSET", "s:gone", "f", "v"}, "+QUEUED"},
		step{[]string{"DISCARD"}, "+OK"})
	if n := pp.direct.Exists(ctx, "s:gone").Val(); n != 0 {
		t.Errorf("a discarded transaction wrote s:gone")
	}

	rep := reportJSON(t, p.Guard())
	if row := findRow(rep, policy.RuleTTL, "incr"); row != nil {
		t.Errorf("the limiter that set its TTL was recorded: %+v", row)
	}
	// (Rows are per key pattern: s:{f}fixed and s:gone have one each.)
	var hset guard.Row
	for _, r := range rep.Rows {
		if r.Rule == policy.RuleTTL && r.Command == "hset" {
			hset.Count, hset.Fixed = hset.Count+r.Count, hset.Fixed+r.Fixed
		}
	}
	if hset.Fixed != 2 || hset.Count != 2 {
		t.Errorf("hset rows (fixed at EXEC, left at DISCARD): %d fixed of %d, want 2 of 2", hset.Fixed, hset.Count)
	}
	row := findRow(rep, policy.RuleTTL, "set")
	if row == nil || row.Refused < 1 || !strings.HasPrefix(row.ExampleKey, "l:") {
		t.Errorf("set row: %+v", row)
	}
	// The same transactions sent in one write each pass as before.
	nc := p.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}, []string{"INCR", "s:one"}, []string{"EXPIRE", "s:one", "90", "NX"}, []string{"EXEC"}),
		[]string{"+OK", "+QUEUED", "+QUEUED", "*[:1 :1]"})
	pp.wantTTL(t, "s:one", 90*time.Second)
}

// Found by review of the cluster's typed transactions, against a real
// cluster: a write whose requirement was left to the transaction and then
// not kept is recorded all the same, and a write after a MULTI Redis
// refused is not left open.
func TestTransactionByStepPlacedFaults(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	start := func(mutate func(*config.Config)) *proxytest.Proxy {
		return proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
			cfg.Upstream.Mode = config.ModeCluster
			cfg.Upstream.Seeds = c.Seeds()
			cfg.Policy = holesPolicy()
			if mutate != nil {
				mutate(cfg)
			}
		})
	}
	direct := c.ClusterClient(t)
	setRows := func(p *proxytest.Proxy) (n int64) {
		for _, r := range reportJSON(t, p.Guard()).Rows {
			if r.Rule == policy.RuleTTL && r.Command == "set" {
				n += r.Count
			}
		}
		return n
	}

	t.Run("MULTI refused by the upstream user's ACL", func(t *testing.T) {
		// The placing SET was taken as inside the MULTI the proxy sent
		// and left open; Redis ran it at once, without its TTL.
		for _, n := range c.Nodes {
			check(t, "ACL SETUSER", n.Client(t).Do(ctx, "ACL", "SETUSER", "nomulti", "on", ">pw", "~*", "&*", "+@all", "-multi").Err())
		}
		p := start(func(cfg *config.Config) { cfg.Upstream.Username, cfg.Upstream.Password = "nomulti", "pw" })
		steps(t, p,
			step{[]string{"AUTH", "nomulti", "pw"}, "+OK"},
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:m", "v"}, `-ERR redproxy policy: key "l:m" needs a TTL...`},
			step{[]string{"EXEC"}, "-ERR EXEC without MULTI"})
		if n := direct.Exists(ctx, "l:m").Val(); n != 0 {
			t.Errorf("l:m written, PTTL %v", direct.PTTL(ctx, "l:m").Val())
		}
		if n := setRows(p); n != 1 {
			t.Errorf("%d set violations recorded, want 1", n)
		}
	})

	p := start(nil)
	t.Run("CROSSSLOT", func(t *testing.T) {
		// Refused by the placed transaction before guardStep kept it.
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:{a}x", "v"}, "+QUEUED"},
			step{[]string{"SET", "l:{b}y", "v"}, "-CROSSSLOT..."},
			step{[]string{"EXEC"}, "-EXECABORT..."})
		if n := setRows(p); n != 2 {
			t.Errorf("%d set violations recorded, want 2 (as for the same transaction in one write)", n)
		}
	})

	t.Run("the slot's node down", func(t *testing.T) {
		// placeHeld finds no connection: the placing write is answered
		// with the error and its requirement recorded.
		owner := func(key string) *redistest.Server {
			slot := direct.ClusterKeySlot(ctx, key).Val()
			for _, s := range direct.ClusterSlots(ctx).Val() {
				if int64(s.Start) <= slot && slot <= int64(s.End) {
					for _, n := range c.Nodes {
						if n.Addr() == s.Nodes[0].Addr {
							return n
						}
					}
				}
			}
			t.Fatalf("no owner of %s", key)
			return nil
		}
		var key string
		for i := 0; key == ""; i++ {
			k := fmt.Sprintf("l:{%d}", i)
			if o := owner(k); o != c.Nodes[0] {
				o.Kill(t)
				key = k
			}
		}
		before := setRows(p)
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", key, "v"}, "-..."},
			step{[]string{"EXEC"}, "-EXECABORT..."})
		if n := setRows(p) - before; n != 1 {
			t.Errorf("%d set violations recorded, want 1", n)
		}
	})
}
