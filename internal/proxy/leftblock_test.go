package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// startTTLBehindHolder starts a proxy whose policy requires a TTL on fx:*
// keys (an hour by default), in front of a Redis behind a forwarder that
// can hold the replies to the connection that sent blocking.
func startTTLBehindHolder(t *testing.T, blocking string) (*proxytest.Proxy, *holdingForwarder, *redis.Client) {
	r := redistest.Start(t)
	fw := startHoldingForwarder(t, r.Addr(), blocking)
	p := proxytest.Start(t, r, func(c *config.Config) {
		c.Upstream.Address = fw.addr
		c.Policy.TTL = []policy.TTLRule{{Pattern: "fx:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	return p, fw, r.Client(t)
}

// A client killed (CLIENT KILL) after Redis served its BLMOVE, with the
// reply still on its way to the proxy: the block is ended as for a client
// that left (CLIENT UNBLOCK, then the reply read), and the destination
// gets its policy TTL. Closed at once, the connection lost the reply and
// with it the fix-up: a key the policy requires a TTL on lived for ever
// (seen in CI, where the kill came before the proxy had read the reply).
func TestClientKillAfterRedisServedABlockedMoveKeepsItsTTL(t *testing.T) {
	p, fw, direct := startTTLBehindHolder(t, "BLMOVE")
	victim := dialRaw(t, p.Addr)
	victim.send([]string{"CLIENT", "ID"})
	id, _ := victim.readReply()
	victim.send([]string{"BLMOVE", "fx:src", "fx:dst", "LEFT", "RIGHT", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLMOVE never blocked")
	fw.hold.Store(true)
	if err := direct.RPush(ctx, "fx:src", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := direct.LLen(ctx, "fx:dst").Result(); n != 1 {
		t.Fatalf("LLEN fx:dst = %d after the push: Redis did not serve the BLMOVE", n)
	}
	admin := dialRaw(t, p.Addr)
	admin.send([]string{"CLIENT", "KILL", "ID", fmt.Sprint(id)})
	// The reply is let through once the proxy is ending the block: it
	// arrives after the kill, as on a busy machine.
	redistest.Eventually(t, 5*time.Second, fw.sawUnblock.Load,
		"the killed client's block was not ended with CLIENT UNBLOCK")
	close(fw.release)
	if v, _ := admin.readReply(); v != int64(1) {
		t.Fatalf("CLIENT KILL: %#v", v)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return direct.TTL(ctx, "fx:dst").Val() > 0 },
		"fx:dst has TTL %v: the BLMOVE's fix-up was lost to the kill", direct.TTL(ctx, "fx:dst").Val())
	if v := direct.LRange(ctx, "fx:dst", 0, -1).Val(); strings.Join(v, ",") != "v" {
		t.Fatalf("fx:dst = %q, want the moved element", v)
	}
}

// A client that leaves after Redis popped for it has the element put back
// (requeue.go); when the pop had emptied the list, Redis deleted it with
// its TTL, and the push that puts the element back makes the key again:
// it gets the policy's TTL as any write through the proxy does. Without
// it, the key the policy requires a TTL on lived for ever.
func TestPopPutBackForAClientThatLeftGetsItsTTL(t *testing.T) {
	p, fw, direct := startTTLBehindHolder(t, "BLPOP")
	worker := dialRaw(t, p.Addr)
	worker.send([]string{"BLPOP", "fx:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
	fw.hold.Store(true)
	producer := dialRaw(t, p.Addr)
	wantReplies(t, producer, []string{"RPUSH", "fx:q", "job"}, int64(1))
	if n, _ := direct.Exists(ctx, "fx:q").Result(); n != 0 {
		t.Fatal("fx:q still exists: Redis did not pop the job for the blocked client")
	}
	worker.nc.Close()
	redistest.Eventually(t, 5*time.Second, fw.sawUnblock.Load, "the departed client's block was not ended with CLIENT UNBLOCK")
	close(fw.release)
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Join(direct.LRange(ctx, "fx:q", 0, -1).Val(), ",") == "job" },
		"the job popped for the departed client was not put back")
	if ttl := direct.TTL(ctx, "fx:q").Val(); ttl <= 0 {
		t.Fatalf("fx:q has TTL %v once the job was put back; the policy requires one", ttl)
	}
}
