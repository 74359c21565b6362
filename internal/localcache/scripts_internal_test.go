package localcache

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

func TestMentionsSwapDB(t *testing.T) {
	for s, want := range map[string]bool{
		"return redis.call('SWAPDB', 0, 1)": true,
		"redis.call('swapdb')":              true,
		"sWaPdB":                            true,
		"swapd":                             false,
		"swap db":                           false,
		"return redis.call('GET', KEYS[1])": false,
		"SWAPDb":                            true,
		"":                                  false,
		"S\x00APDB":                         false,
	} {
		if got := MentionsSwapDB([]byte(s)); got != want {
			t.Errorf("MentionsSwapDB(%q) = %v, want %v", s, got, want)
		}
	}
}

// mentionsSwapDBSlow is the byte-by-byte definition MentionsSwapDB must
// agree with.
func mentionsSwapDBSlow(b []byte) bool {
	for i := 0; i+6 <= len(b); i++ {
		if b[i]|0x20 == 's' && b[i+1]|0x20 == 'w' && b[i+2]|0x20 == 'a' &&
			b[i+3]|0x20 == 'p' && b[i+4]|0x20 == 'd' && b[i+5]|0x20 == 'b' {
			return true
		}
	}
	return false
}

func FuzzMentionsSwapDB(f *testing.F) {
	for _, s := range []string{"swapdb", "xSWAPDB", "swswapdb", "wwapdb", "swapd", "sw", "w", "SwApDbW", "redis.call('swapdb', 0, 1)"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := MentionsSwapDB(b), mentionsSwapDBSlow(b); got != want {
			t.Fatalf("MentionsSwapDB(%q) = %v, byte by byte %v", b, got, want)
		}
	})
}

// A rate limiter's script, the kind sent with EVAL on every request.
var rateLimiterScript = []byte(`local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local count = redis.call('ZCARD', key)
if count < limit then
  redis.call('ZADD', key, now, now .. '-' .. math.random())
  redis.call('PEXPIRE', key, window)
  return {1, limit - count - 1}
end
return {0, 0}`)

func BenchmarkMentionsSwapDB(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(rateLimiterScript)))
	for b.Loop() {
		if MentionsSwapDB(rateLimiterScript) {
			b.Fatal("found swapdb in the rate limiter")
		}
	}
}

func BenchmarkMentionsSwapDBByteByByte(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(rateLimiterScript)))
	for b.Loop() {
		if mentionsSwapDBSlow(rateLimiterScript) {
			b.Fatal("found swapdb in the rate limiter")
		}
	}
}

// What NoteScript saw decides which EVALSHA and FCALL are handled as a
// SWAPDB; past maxSwapScripts remembered scripts every EVALSHA is.
func TestScriptSwaps(t *testing.T) {
	c := &Cache{}
	table := commands.Builtin()
	cmd := func(args ...string) (*commands.Command, [][]byte) {
		raw := make([][]byte, len(args))
		for i, a := range args {
			raw[i] = []byte(a)
		}
		return table.Lookup(raw), raw
	}
	note := func(args ...string) { c.NoteScript(cmd(args...)) }
	swaps := func(args ...string) bool { return c.scriptSwaps(cmd(args...)) }
	sha := func(body string) string { s := sha1.Sum([]byte(body)); return hex.EncodeToString(s[:]) }

	swap, plain := "return redis.call('SWAPDB','0','1')", "return redis.call('GET', KEYS[1])"
	if !swaps("EVAL", swap, "0") || swaps("EVAL", plain, "1", "k") {
		t.Fatal("EVAL: its own text decides")
	}
	if swaps("EVALSHA", sha(swap), "0") {
		t.Fatal("EVALSHA of a script never seen handled as a SWAPDB")
	}
	note("SCRIPT", "LOAD", plain)
	note("EVAL", plain, "0")
	if c.scripts.nshas.Load() != 0 {
		t.Fatal("a script not mentioning swapdb remembered")
	}
	note("SCRIPT", "LOAD", swap)
	if !swaps("EVALSHA", sha(swap), "0") || !swaps("EVALSHA", strings.ToUpper(sha(swap)), "0") || swaps("EVALSHA", sha(plain), "0") {
		t.Fatal("EVALSHA after SCRIPT LOAD")
	}
	note("EVAL_RO", swap+" ", "0")
	if !swaps("EVALSHA", sha(swap+" "), "0") {
		t.Fatal("EVALSHA after EVAL_RO")
	}
	if swaps("FCALL", "f", "0") {
		t.Fatal("FCALL before any library mentioning swapdb")
	}
	note("FUNCTION", "LOAD", "#!lua name=a\nredis.register_function('f', function() return 1 end)")
	if swaps("FCALL", "f", "0") {
		t.Fatal("FCALL after a library not mentioning swapdb")
	}
	note("FUNCTION", "LOAD", "REPLACE", "#!lua name=b\nredis.register_function('g', function() return redis.call('SWAPDB', 0, 1) end)")
	if !swaps("FCALL", "f", "0") {
		t.Fatal("FCALL after a library mentioning swapdb")
	}
	for i := 0; c.scripts.nshas.Load() <= maxSwapScripts; i++ {
		note("SCRIPT", "LOAD", fmt.Sprintf("%s -- %d", swap, i))
	}
	if !swaps("EVALSHA", sha(plain), "0") {
		t.Fatal("EVALSHA past maxSwapScripts not handled as a SWAPDB")
	}
}

// With no script mentioning swapdb seen, EVALSHA's check allocates nothing;
// nor does it once one is.
func TestScriptSwapsAllocs(t *testing.T) {
	c := &Cache{}
	table := commands.Builtin()
	args := [][]byte{[]byte("EVALSHA"), []byte(strings.Repeat("ab", 20)), []byte("0")}
	ev := table.Lookup(args)
	if n := testing.AllocsPerRun(100, func() { c.scriptSwaps(ev, args) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
	load := [][]byte{[]byte("SCRIPT"), []byte("LOAD"), []byte("redis.call('swapdb', 0, 1)")}
	c.NoteScript(table.Lookup(load), load)
	if n := testing.AllocsPerRun(100, func() { c.scriptSwaps(ev, args) }); n != 0 {
		t.Fatalf("%v allocations once a script was seen", n)
	}
}
