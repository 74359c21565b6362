package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A blocking command that reaches Redis while clients are paused for
// writes (CLIENT PAUSE WRITE, as in a failover) is held back, and Redis
// 7.0 crashes when CLIENT UNBLOCK names such a client ("Unknown btype in
// replyToBlockedClientTimedOut"). The proxy unblocks a client's
// connection when the client leaves, and for a CLIENT UNBLOCK another
// client sends: found by review, either killed Redis. Now the UNBLOCK
// waits for the pause to end, and Redis stays up.
func TestUnblockDuringAPauseLeavesRedisUp(t *testing.T) {
	rs := redistest.Start(t)
	direct := rs.Client(t)
	p := proxytest.Start(t, rs, nil)
	heldBLPOPs := func() int {
		list, err := direct.ClientList(ctx).Result()
		if err != nil {
			t.Fatalf("CLIENT LIST: %v (Redis down?)", err)
		}
		return strings.Count(list, "cmd=blpop")
	}
	pause := func() {
		if err := direct.Do(ctx, "CLIENT", "PAUSE", "1500", "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("the client leaves", func(t *testing.T) {
		pause()
		c := dialRaw(t, p.Addr)
		c.send([]string{"BLPOP", "held:left", "0"})
		redistest.Eventually(t, 5*time.Second, func() bool { return heldBLPOPs() == 1 }, "BLPOP never reached Redis")
		c.nc.Close()
		redistest.Eventually(t, 10*time.Second, func() bool { return heldBLPOPs() == 0 }, "the proxy never ended the BLPOP")
		if err := direct.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after the UNBLOCK: %v", err)
		}
		// Nothing is left waiting to pop what comes next.
		if err := direct.RPush(ctx, "held:left", "x").Err(); err != nil {
			t.Fatal(err)
		}
		if n := direct.LLen(ctx, "held:left").Val(); n != 1 {
			t.Fatalf("LLEN = %d after a push for a client that left", n)
		}
	})

	t.Run("another client unblocks it", func(t *testing.T) {
		pause()
		blocked := dialRaw(t, p.Addr)
		blocked.wait = 10 * time.Second
		id := blocked.do("CLIENT", "ID").(int64)
		blocked.send([]string{"BLPOP", "held:named", "0"})
		redistest.Eventually(t, 5*time.Second, func() bool { return heldBLPOPs() == 1 }, "BLPOP never reached Redis")
		other := dialRaw(t, p.Addr)
		other.wait = 10 * time.Second
		if got := other.do("CLIENT", "UNBLOCK", itoa64(id)); got != int64(1) {
			t.Fatalf("CLIENT UNBLOCK = %#v, want 1", got)
		}
		if got, _ := blocked.readReply(); got != nil {
			t.Fatalf("the unblocked BLPOP answered %#v, want a null", got)
		}
		if err := direct.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after the UNBLOCK: %v", err)
		}
	})
}

// A CLIENT UNBLOCK that cannot reach Redis answers in the proxy's words
// for an upstream that does not answer, as every other command does, not
// with Go's text of the failure ("-ERR read tcp 127.0.0.1:53782->...: i/o
// timeout", found by review).
func TestUnblockOfAFrozenRedisAnswersAnUpstreamError(t *testing.T) {
	rs := redistest.Start(t)
	direct := rs.Client(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.DialTimeout = units.Duration{Duration: 100 * time.Millisecond}
	})
	blocked := dialRaw(t, p.Addr)
	id := blocked.do("CLIENT", "ID").(int64)
	blocked.send([]string{"BLPOP", "frozen:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
	other := dialRaw(t, p.Addr)
	rs.Freeze(t)
	got := other.do("CLIENT", "UNBLOCK", itoa64(id))
	rs.Thaw(t)
	if e, ok := got.(respError); !ok || !strings.HasPrefix(string(e), "ERR redproxy: upstream ") {
		t.Fatalf("CLIENT UNBLOCK of a frozen Redis = %#v", got)
	}
}
