package localcache_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/localcache"
)

// Redis 7.0 sends no tracking invalidation when a stream's consumer groups
// change (XREADGROUP, XACK, XCLAIM, XAUTOCLAIM, XSETID, XGROUP ...), so the
// replies that show that state (XINFO GROUPS/CONSUMERS/STREAM, XPENDING)
// were kept by the tier until max_ttl after a consumer read, whether that
// write went straight to Redis or through the proxy inside a script (found
// by review). The tier no longer keeps them at all.
func TestTierNeverKeepsConsumerGroupState(t *testing.T) {
	// The last two carry an idle time in milliseconds, so only the hit
	// count is checked for them: no two reads need agree.
	reads := [][]any{
		{"XINFO", "GROUPS", "s"},
		{"XINFO", "STREAM", "s", "FULL"},
		{"XPENDING", "s", "g"},
		{"XINFO", "CONSUMERS", "s", "g"},
		{"XPENDING", "s", "g", "-", "+", "10"},
	}
	const compared = 3
	for _, how := range []string{"direct", "script"} {
		t.Run(how, func(t *testing.T) {
			p := startTier(t, nil)
			direct := p.Redis.Client(t)
			for _, cmd := range [][]any{{"XADD", "s", "1-1", "f", "v"}, {"XGROUP", "CREATE", "s", "g", "0"}, {"XGROUP", "CREATECONSUMER", "s", "g", "c1"}} {
				if err := direct.Do(ctx, cmd...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			c := p.Client(t)
			read := func(cmd []any) string {
				t.Helper()
				v, err := c.Do(ctx, cmd...).Result()
				if err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
				return fmt.Sprint(v)
			}
			// Read each often enough to be admitted, were it cacheable
			// (startTier admits every key at once).
			before := make([]string, len(reads))
			hitsBefore := hits(t, p)
			for i, cmd := range reads {
				for range 10 {
					before[i] = read(cmd)
				}
			}
			if h := hits(t, p); h != hitsBefore {
				t.Fatalf("the tier answered %v reads of consumer-group state", h-hitsBefore)
			}
			xreadgroup := []any{"XREADGROUP", "GROUP", "g", "c1", "COUNT", "1", "STREAMS", "s", ">"}
			switch how {
			case "direct":
				if err := direct.Do(ctx, xreadgroup...).Err(); err != nil {
					t.Fatal(err)
				}
			case "script":
				const script = "return redis.call('XREADGROUP','GROUP','g','c1','COUNT','1','STREAMS',ARGV[1],'>')"
				if err := c.Do(ctx, "EVAL", script, "0", "s").Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Past S and the script's fence: nothing may still be served
			// from before the consumer's read.
			time.Sleep(2 * testS)
			for i, cmd := range reads[:compared] {
				want, err := direct.Do(ctx, cmd...).Result()
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(want) == before[i] {
					t.Fatalf("test broken: %v did not change (%s)", cmd, before[i])
				}
				if got := read(cmd); got != fmt.Sprint(want) {
					t.Errorf("%v after the consumer's read was acknowledged:\n got  %s\n want %v", cmd, got, want)
				}
			}
		})
	}
}

func TestConsumerGroupStateNotCacheable(t *testing.T) {
	table := commands.Builtin()
	for _, name := range []string{"xinfo|groups", "xinfo|consumers", "xinfo|stream", "xpending"} {
		if cmd := table.Get(name); cmd == nil {
			t.Errorf("%s not in the command table", name)
		} else if localcache.CacheableCommand(cmd) {
			t.Errorf("%s is cacheable: Redis sends no invalidation when consumer groups change", name)
		}
	}
	if !localcache.CacheableCommand(table.Get("xrange")) {
		t.Error("XRANGE is not cacheable: only consumer-group state is left out")
	}
}
