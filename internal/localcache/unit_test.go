package localcache

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// rawConn sends commands on a raw connection and returns raw replies.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	rd *bufio.Reader
}

func dialRaw(t *testing.T, addr string, hello3 bool) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawConn{t: t, nc: nc, rd: bufio.NewReader(nc)}
	if hello3 {
		c.do("HELLO", "3")
	}
	return c
}

func (c *rawConn) do(args ...string) []byte {
	c.t.Helper()
	raw := resp.AppendCommandStrings(nil, args...)
	c.nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.nc.Write(raw); err != nil {
		c.t.Fatal(err)
	}
	var buf []byte
	for {
		if n, err := resp.ScanReply(buf); err != nil {
			c.t.Fatal(err)
		} else if n > 0 {
			return buf[:n]
		}
		b, err := c.rd.ReadByte()
		if err != nil {
			c.t.Fatal(err)
		}
		buf = append(buf, b)
	}
}

// The RESP2 form the tier derives from a RESP3 reply is exactly what Redis
// sends a RESP2 client, or the conversion is refused.
func TestRESP2ConversionMatchesRedis(t *testing.T) {
	rs := redistest.Start(t)
	r2, r3 := dialRaw(t, rs.Addr(), false), dialRaw(t, rs.Addr(), true)
	for _, c := range [][]string{
		{"SET", "s", "hello"},
		{"HSET", "h", "a", "1", "b", "2"},
		{"RPUSH", "l", "x", "y", "z"},
		{"SADD", "set", "m1", "m2", "m3"},
		{"ZADD", "z", "1", "one", "2.5", "two"},
		{"GEOADD", "geo", "13.361389", "38.115556", "Palermo"},
		{"XADD", "st", "1-1", "f", "v"},
		{"SETBIT", "bits", "7", "1"},
		{"XADD", "empty", "1-1", "f", "v"}, {"XDEL", "empty", "1-1"},
		{"XGROUP", "CREATE", "st", "g", "0"},
	} {
		r2.do(c...)
	}
	tbl := commands.Builtin()
	mustConvert := map[string]bool{"GET": true, "HGETALL": true, "SMEMBERS": true, "LRANGE": true, "HMGET": true, "EXISTS": true, "XRANGE": true, "XREVRANGE": true}
	converted := map[string]bool{}
	for _, c := range [][]string{
		{"GET", "s"}, {"GET", "missing"}, {"STRLEN", "s"}, {"GETRANGE", "s", "0", "2"},
		{"HGET", "h", "a"}, {"HGET", "h", "nope"}, {"HGETALL", "h"}, {"HGETALL", "missing"},
		{"HMGET", "h", "a", "nope"}, {"HKEYS", "h"}, {"HVALS", "h"}, {"HLEN", "h"}, {"HEXISTS", "h", "a"}, {"HSTRLEN", "h", "a"},
		{"LRANGE", "l", "0", "-1"}, {"LRANGE", "missing", "0", "-1"}, {"LINDEX", "l", "9"}, {"LLEN", "l"}, {"LPOS", "l", "nope"},
		{"SMEMBERS", "set"}, {"SISMEMBER", "set", "m1"}, {"SMISMEMBER", "set", "m1", "zz"}, {"SCARD", "set"},
		{"ZRANGE", "z", "0", "-1"}, {"ZRANGE", "z", "0", "-1", "WITHSCORES"}, {"ZSCORE", "z", "two"}, {"ZSCORE", "z", "nope"},
		{"ZRANK", "z", "nope"}, {"ZMSCORE", "z", "one", "nope"}, {"ZCARD", "z"}, {"ZCOUNT", "z", "-inf", "+inf"},
		{"ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES"}, {"ZREVRANGE", "z", "0", "-1"},
		{"GEOPOS", "geo", "Palermo", "Nowhere"}, {"GEOHASH", "geo", "Palermo"}, {"GEODIST", "geo", "Palermo", "Palermo"},
		{"XRANGE", "st", "-", "+"}, {"XLEN", "st"}, {"XINFO", "STREAM", "st"}, {"XINFO", "STREAM", "empty"},
		{"XINFO", "STREAM", "st", "FULL"}, {"XINFO", "STREAM", "empty", "FULL"}, {"XINFO", "GROUPS", "st"},
		{"LPOS", "l", "x", "COUNT", "0"}, {"GEOSEARCH", "geo", "FROMLONLAT", "0", "0", "BYRADIUS", "1", "km"},
		{"BITFIELD_RO", "bits", "GET", "u8", "0"}, {"SUBSTR", "s", "0", "1"}, {"XREVRANGE", "st", "+", "-", "COUNT", "1"},
		{"EXISTS", "s"}, {"EXISTS", "missing"}, {"TYPE", "h"}, {"BITCOUNT", "bits"}, {"GETBIT", "bits", "7"}, {"BITPOS", "bits", "1"},
		// A COUNT of 0 or less: *-1 for RESP2 (found by a probe: the tier
		// served $-1).
		{"XRANGE", "st", "-", "+", "COUNT", "0"}, {"XREVRANGE", "st", "+", "-", "COUNT", "-5"}, {"XRANGE", "missing", "-", "+", "COUNT", "0"},
	} {
		want := r2.do(c...)
		got3 := r3.do(c...)
		argv := make([][]byte, len(c))
		for i, a := range c {
			argv[i] = []byte(a)
		}
		out, ok := toRESP2For(tbl.Lookup(argv), got3)
		name := strings.Join(c, " ")
		if !ok {
			if mustConvert[c[0]] {
				t.Errorf("%s: conversion of %q refused", name, got3)
			}
			continue
		}
		converted[c[0]] = true
		if string(out) != string(want) {
			t.Errorf("%s: converted %q, Redis sends RESP2 clients %q", name, out, want)
		}
	}
	for name := range mustConvert {
		if !converted[name] {
			t.Errorf("%s was never converted", name)
		}
	}
}

func TestCacheable(t *testing.T) {
	tbl := commands.Builtin()
	args := func(s string) [][]byte {
		var out [][]byte
		for _, f := range strings.Fields(s) {
			out = append(out, []byte(f))
		}
		return out
	}
	for _, tc := range []struct {
		cmd string
		key string // "" = not cacheable
	}{
		{"GET k", "k"}, {"HGETALL h", "h"}, {"HMGET h a b", "h"}, {"SMEMBERS s", "s"},
		{"ZRANGE z 0 -1 WITHSCORES", "z"}, {"LRANGE l 0 -1", "l"}, {"EXISTS k", "k"}, {"STRLEN k", "k"},
		{"XRANGE st - +", "st"}, {"MGET k", "k"},
		{"EXISTS a b", ""}, {"MGET a b", ""}, {"TTL k", ""}, {"PTTL k", ""}, {"EXPIRETIME k", ""},
		{"OBJECT ENCODING k", ""}, {"RANDOMKEY", ""}, {"SRANDMEMBER s", ""}, {"HRANDFIELD h", ""},
		{"ZRANDMEMBER z", ""}, {"SCAN 0", ""}, {"SSCAN s 0", ""}, {"SORT_RO l BY w*", ""}, {"TOUCH k", ""},
		{"SET k v", ""}, {"GETEX k", ""}, {"GETDEL k", ""}, {"EVAL_RO x 1 k", ""}, {"FCALL_RO f 1 k", ""},
		{"PFCOUNT h", "h"}, {"XREAD STREAMS st 0", ""}, {"BLPOP l 0", ""}, {"XINFO CONSUMERS st g", ""},
		{"MEMORY USAGE k", ""}, {"DUMP k", ""}, {"PING", ""},
		{"ZRANK z m", "z"}, {"ZREVRANK z m", "z"}, {"ZRANK z m WITHSCORE", ""}, {"ZREVRANK z m WITHSCORE", ""},
	} {
		a := args(tc.cmd)
		key, ok := Cacheable(tbl.Lookup(a), a)
		if got := string(key); ok != (tc.key != "") || got != tc.key {
			t.Errorf("Cacheable(%s) = %q, %v; want %q", tc.cmd, got, ok, tc.key)
		}
	}
	for _, tc := range []struct {
		cmd     string
		unknown bool
	}{
		{"SET k v", false}, {"DEL a b", false}, {"ZUNIONSTORE d 2 a b", false}, {"SORT l STORE d", false},
		{"EVAL x 1 k", true}, {"EVALSHA x 0", true}, {"FCALL f 0", true}, {"MOVE k 1", true},
		{"COPY a b", false}, {"COPY a b DB 2", true}, {"COPY a b db 2 REPLACE", true},
		{"MIGRATE h 1 \"\" 0 5 KEYS a b", false}, {"GEORADIUS g 0 0 1 km STORE d", false}, {"XREADGROUP GROUP g c STREAMS s >", false},
	} {
		a := args(tc.cmd)
		if got := unknownKeys(tbl.Lookup(a), a); got != tc.unknown {
			t.Errorf("unknownKeys(%s) = %v, want %v", tc.cmd, got, tc.unknown)
		}
	}
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pat, key string
		want     bool
	}{
		{"*", "", true}, {"*", "abc", true}, {"user:*", "user:1", true}, {"user:*", "users", false},
		{"a?c", "abc", true}, {"a?c", "ac", false}, {"h[ae]llo", "hallo", true}, {"h[ae]llo", "hillo", false},
		{"h[^e]llo", "hallo", true}, {"h[^e]llo", "hello", false}, {"h[a-c]llo", "hbllo", true}, {"h[c-a]llo", "hbllo", true},
		{`h\*llo`, "h*llo", true}, {`h\*llo`, "hallo", false}, {"*a*b*c", "xxaxxbxxc", true}, {"*a*b*c", "xxaxxcxxb", false},
		{"a*", "a", true}, {"**", "x", true}, {`[\]]`, "]", true}, {"[abc", "b", true},
	} {
		if got := matchGlob(tc.pat, []byte(tc.key)); got != tc.want {
			t.Errorf("matchGlob(%q, %q) = %v, want %v", tc.pat, tc.key, got, tc.want)
		}
	}
	for _, p := range []string{"[abc", `abc\`} {
		if checkGlob(p) == nil {
			t.Errorf("checkGlob(%q) accepted it", p)
		}
	}
	if err := checkGlob(`user:[0-9]*\*`); err != nil {
		t.Errorf("checkGlob rejected a valid pattern: %v", err)
	}
}

func TestSketch(t *testing.T) {
	s := newSketch(4096)
	hot, cold := uint64(0xabcdef12345), uint64(0x1234567)
	for range 50 {
		s.add(hot, 1)
	}
	s.add(cold, 1)
	if e := s.estimate(hot); e < 50 {
		t.Fatalf("estimate(hot) = %d, want >= 50 (count-min never underestimates)", e)
	}
	if e := s.estimate(cold); e != 1 {
		t.Fatalf("estimate(cold) = %d after one sighting, want 1 (doorkeeper only)", e)
	}
	for range 1000 {
		s.add(hot, 1)
	}
	if e := s.estimate(hot); e != counterMax+1 {
		t.Fatalf("estimate saturates at %d, got %d", counterMax+1, e)
	}
	s.halve()
	if e := s.estimate(hot); e != counterMax/2 {
		t.Fatalf("after halving, estimate = %d, want %d", e, counterMax/2)
	}
	if e := s.estimate(cold); e != 0 {
		t.Fatalf("after halving, a key seen once is forgotten; estimate = %d", e)
	}
	// Many distinct keys: few collide into a high estimate.
	s = newSketch(4096)
	for i := range uint64(4096) {
		s.add(i*0x9E3779B97F4A7C15, 3)
	}
	high := 0
	for i := range uint64(4096) {
		if s.estimate((i+1<<32)*0x9E3779B97F4A7C15) > 3 {
			high++
		}
	}
	if high > 4096/20 {
		t.Fatalf("%d of 4096 unseen keys estimated above 3", high)
	}

	// As many sightings as a row has counters make a halving due, so
	// heavy traffic cannot saturate the counters within one window.
	s = newSketch(4096)
	due := 0
	for i := range uint64(4096) {
		if s.add(i, 1) {
			due++
		}
	}
	if due != 1 {
		t.Fatalf("halving due %d times after 4096 sightings, want once (at the 4096th)", due)
	}
	s.halve()
	if s.add(1, 1) {
		t.Fatal("halving due right after halving")
	}
}

func TestRESP2Helpers(t *testing.T) {
	for in, want := range map[string]string{
		"_\r\n":                         "$-1\r\n",
		"%1\r\n$1\r\na\r\n:1\r\n":       "*2\r\n$1\r\na\r\n:1\r\n",
		"~2\r\n$1\r\na\r\n$1\r\nb\r\n":  "*2\r\n$1\r\na\r\n$1\r\nb\r\n",
		"*2\r\n_\r\n%0\r\n":             "*2\r\n$-1\r\n*0\r\n",
		"$5\r\nhello\r\n":               "$5\r\nhello\r\n",
		"*1\r\n%1\r\n$1\r\nk\r\n~0\r\n": "*1\r\n*2\r\n$1\r\nk\r\n*0\r\n",
		"+OK\r\n":                       "+OK\r\n",
	} {
		out, ok := toRESP2([]byte(in))
		if !ok || string(out) != want {
			t.Errorf("toRESP2(%q) = %q, %v; want %q", in, out, ok, want)
		}
	}
	for _, in := range []string{",1.5\r\n", "#t\r\n", "(123\r\n", "=8\r\ntxt:abcd\r\n", "*1\r\n,1\r\n", "*2\r\n:1\r\n"} {
		if out, ok := toRESP2([]byte(in)); ok {
			t.Errorf("toRESP2(%q) = %q, want it refused", in, out)
		}
	}
}

// TestCountReadSampled checks that reads counted through CountRead (those
// behind other commands of a pipelined batch) are sampled yet still make a
// key that is read often enough hot: counted as a multiple of the sample,
// touching the sketch for about one read in countReadSample, and admitted
// after a few dozen reads as it would be without sampling.
func TestCountReadSampled(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Enabled = true
	cfg.AdmitWindow = units.Duration{Duration: time.Hour} // no halving during the test
	c, err := New(cfg, Options{Upstream: func(int) upstream.Options { return upstream.Options{Addr: "127.0.0.1:1"} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	get := commands.Builtin().Get("get")
	const reads = 4000
	for i := range reads {
		c.CountRead(0, get, [][]byte{[]byte("GET"), fmt.Appendf(nil, "cold:%d", i)})
	}
	if counted := c.reads.adds.Load(); counted%countReadSample != 0 {
		t.Fatalf("sketch counted %d sightings, not a multiple of the sample %d", counted, countReadSample)
	}
	seen := 0
	for i := range reads {
		if c.reads.seen(c.hash(0, fmt.Appendf(nil, "cold:%d", i))) {
			seen++
		}
	}
	// Binomial(4000, 1/4): mean 1000, standard deviation 27; 300 either
	// way is 11 of them (and doorkeeper collisions add a few).
	if seen < reads/countReadSample-300 || seen > reads/countReadSample+300 {
		t.Fatalf("%d of %d keys read once are in the sketch, want about %d", seen, reads, reads/countReadSample)
	}
	hot := []byte("hot:1")
	h := c.hash(0, hot)
	for range 64 {
		c.CountRead(0, get, [][]byte{[]byte("GET"), hot})
	}
	// Admitted once 3 of the 64 are sampled (doorkeeper, then 3 + 4 + 4
	// in the counters); fewer happen with probability 2·10^-6.
	if est := c.reads.estimate(h); est <= uint64(cfg.AdmitMinReads) {
		t.Fatalf("after 64 pipelined reads the key's estimate is %d, not above admit_min_reads %d", est, cfg.AdmitMinReads)
	}
	if reason := c.admit(h, 0, hot); reason != "" {
		t.Fatalf("a key read 64 times in pipelines was not admitted: %s", reason)
	}
}
