package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// TestRefusedFillerWriteEndsItsHold: a filler whose write the proxy
// refuses (the policy, its user's ACL) will not fill the key, so the reads
// held for it fetch again at once instead of waiting out the hold's
// timeout (found by a probe: 100 readers waited 2 s behind a filler whose
// SET was refused for its size). Another client's refused write of the
// key ends nothing: the held read still gets the filler's value.
func TestRefusedFillerWriteEndsItsHold(t *testing.T) {
	const pass = "hold-refused-8c1f"
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Stampede.Hold = []stampede.HoldRule{{Pattern: "h:*", Timeout: units.Duration{Duration: time.Minute}}}
		// A write of h:* needs a TTL and gets none by default: refused.
		c.Policy.TTL = []policy.TTLRule{{Pattern: "h:*", Required: true}}
		c.Users = []auth.UserConfig{
			user("app", pass, "+@all ~* allchannels"),
			user("noset", pass, "+@all -set ~* allchannels"),
		}
	})
	client := func(name string) *rawConn {
		c := dialRaw(t, p.Addr)
		if v := c.do("AUTH", name, pass); v != "OK" {
			t.Fatalf("AUTH %s: %v", name, v)
		}
		return c
	}
	held := func(key string) <-chan string {
		before := metricSum(t, p, "redproxy_stampede_held_reads_total")
		got := make(chan string, 1)
		go func() {
			c := p.Client(t, func(o *redis.Options) { o.Username, o.Password, o.ReadTimeout = "app", pass, 2*time.Minute })
			v, err := c.Get(ctx, key).Result()
			if err != nil {
				v = "error: " + err.Error()
			}
			got <- v
		}()
		redistest.Eventually(t, 10*time.Second, func() bool {
			return metricSum(t, p, "redproxy_stampede_held_reads_total") > before
		}, "the read of %s was never held", key)
		return got
	}
	released := func(got <-chan string, want, why string) {
		t.Helper()
		select {
		case v := <-got:
			if v != want {
				t.Fatalf("%s: the held read got %q, want %q", why, v, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the held read still waits (for the one-minute hold timeout)", why)
		}
	}
	refused := func(c *rawConn, prefix string, args ...string) {
		t.Helper()
		if e, ok := c.do(args...).(respError); !ok || !strings.HasPrefix(string(e), prefix) {
			t.Fatalf("%v: want an error starting %q", args, prefix)
		}
	}

	for _, tc := range []struct {
		user, prefix string
		write        []string
	}{
		{"app", "ERR redproxy policy", []string{"SET", "h:policy", "v"}},
		{"noset", "NOPERM", []string{"SET", "h:acl", "v", "EX", "60"}},
	} {
		filler := client(tc.user)
		key := tc.write[1]
		if v := filler.do("GET", key); v != nil {
			t.Fatalf("the filler's GET %s = %v, want a miss", key, v)
		}
		got := held(key)
		refused(filler, tc.prefix, tc.write...)
		released(got, "error: "+redis.Nil.Error(), tc.user+"'s refused write")
	}

	filler, other := client("app"), client("noset")
	if v := filler.do("GET", "h:other"); v != nil {
		t.Fatalf("the filler's GET = %v, want a miss", v)
	}
	got := held("h:other")
	refused(other, "NOPERM", "SET", "h:other", "x", "EX", "60")
	refused(other, "ERR redproxy policy", "APPEND", "h:other", "x")
	if v := filler.do("SET", "h:other", "filled", "EX", "60"); v != "OK" {
		t.Fatalf("the filler's SET = %v", v)
	}
	released(got, "filled", "another client's refused writes, then the filler's write")
}
