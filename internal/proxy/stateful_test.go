package proxy_test

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Transactions behave as on Redis: queued replies, queue-time errors abort
// with EXECABORT, a touched WATCH aborts EXEC with a null, DISCARD drops.
func TestTransactionSemantics(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	expect := lineExpecter(t, p, func(line, want string) bool { return line == want })
	expect("MULTI\r\nSET a 1\r\nINCR a\r\nPING\r\nEXEC\r\n",
		"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "*3\r\n", "+OK\r\n", ":2\r\n", "+PONG\r\n")
	expect("MULTI\r\nSET a\r\nEXEC\r\n",
		"+OK\r\n", "-ERR wrong number of arguments for 'set' command\r\n", "-EXECABORT Transaction discarded because of previous errors.\r\n")
	expect("MULTI\r\nSET a 5\r\nDISCARD\r\nGET a\r\n", "+OK\r\n", "+QUEUED\r\n", "+OK\r\n", "$1\r\n", "2\r\n")
	expect("WATCH a\r\n", "+OK\r\n")
	if err := p.Redis.Client(t).Set(ctx, "a", "changed", 0).Err(); err != nil {
		t.Fatal(err)
	}
	expect("MULTI\r\nSET a mine\r\nEXEC\r\nGET a\r\n", "+OK\r\n", "+QUEUED\r\n", "*-1\r\n", "$7\r\n", "changed\r\n")
	expect("EXEC\r\n", "-ERR EXEC without MULTI\r\n")
	expect("UNWATCH\r\nDISCARD\r\n", "+OK\r\n", "-ERR DISCARD without MULTI\r\n")
}

// A blocking pop waits as long as the command says, with no proxy timeout
// cutting it short, and other clients are not held up meanwhile.
func TestBlockingCommandWaitsOnItsOwnConnection(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.ReplyTimeout.Duration = 200 * time.Millisecond })
	blocker := p.Client(t)
	other := p.Client(t)
	got := make(chan []string, 1)
	go func() {
		v, _ := blocker.BLPop(ctx, 0, "queue").Result()
		got <- v
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		n, _ := p.Redis.Client(t).Do(ctx, "INFO", "clients").Text()
		return strings.Contains(n, "blocked_clients:1")
	}, "BLPOP never blocked in Redis")
	// Past the reply timeout the blocked client must still be waiting, and
	// others are served normally.
	for i := 0; i < 5; i++ {
		if err := other.Incr(ctx, "n").Err(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case v := <-got:
		t.Fatalf("BLPOP returned early: %v", v)
	case <-time.After(400 * time.Millisecond):
	}
	if err := other.RPush(ctx, "queue", "job").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if len(v) != 2 || v[1] != "job" {
			t.Fatalf("BLPOP got %v", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("BLPOP never returned after the push")
	}
	if err := blocker.BLPop(ctx, 100*time.Millisecond, "empty").Err(); err != redis.Nil {
		t.Fatalf("BLPOP with timeout on empty list: %v", err)
	}
}

// A client that became a relay (here by CLIENT TRACKING ON, as rueidis
// does) is still guarded: refusals come back in order on the raw stream,
// in the batch that started the relay and in later ones, and nothing
// refused reaches Redis.
func TestRelayedClientIsStillGuarded(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	expect := lineExpecter(t, p, strings.HasPrefix)
	expect("CLIENT TRACKING ON\r\nKEYS *\r\nSET a 1\r\nFLUSHALL\r\nGET a\r\n",
		"+OK", "-ERR redproxy policy: KEYS is disabled", "+OK", "-ERR redproxy policy: FLUSHALL is disabled", "$1", "1")
	expect("FLUSHDB\r\nGET a\r\n", "-ERR redproxy policy: FLUSHDB is disabled", "$1", "1")
	if n, err := p.Redis.Client(t).Exists(ctx, "a").Result(); err != nil || n != 1 {
		t.Fatalf("a refused flush reached Redis: exists=%d %v", n, err)
	}
}

// WAIT through the proxy waits for the client's own earlier writes, which
// went over shared connections, not for the (empty) history of the
// dedicated connection WAIT runs on.
func TestWaitCoversWritesOnSharedConnections(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	replica := onlineReplica(t, p.Redis)
	// A frozen replica acknowledges nothing: WAIT for a write made after
	// the freeze must time out with 0, not report the replica as caught up.
	waitCountsWrites(t, p.Client(t), replica)
}

// lineExpecter opens a raw connection to p and returns a function that
// sends raw requests and checks each reply line that comes back against
// want with match (exact, or a prefix for long error texts).
func lineExpecter(t *testing.T, p *proxytest.Proxy, match func(line, want string) bool) func(send string, want ...string) {
	nc := p.Dial(t)
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(nc)
	return func(send string, want ...string) {
		t.Helper()
		nc.Write([]byte(send))
		for _, w := range want {
			line, err := rd.ReadString('\n')
			if err != nil || !match(line, w) {
				t.Fatalf("after %q: got %q %v, want %q", send, line, err, w)
			}
		}
	}
}
