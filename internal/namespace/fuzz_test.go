package namespace

import (
	"bytes"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

// allCommands lists every command and subcommand of the builtin table.
func allCommands() []*commands.Command {
	var all []*commands.Command
	for _, c := range commands.Builtin().Commands() {
		all = append(all, c)
		for _, s := range c.Subcommands {
			all = append(all, s)
		}
	}
	return all
}

// fuzzWords are arguments that steer key specs and option parsers: the
// keywords key specs search for, counts, SORT's and SCAN's options.
var fuzzWords = []string{"STORE", "STOREDIST", "STREAMS", "KEYS", "BY", "GET", "MATCH",
	"LIMIT", "0", "1", "2", "3", "#", "COUNT", "BLOCK", "GROUP", "AUTH", "AUTH2", "",
	"__keyspace@0__:k", "__keyevent@0__:set", "TYPE", "WITHSCORES", "NUMKEYS"}

// fuzzArgs builds a command line for cmd from data: pieces split on 0xff,
// a one-byte piece below len(fuzzWords) standing for that word.
func fuzzArgs(cmd *commands.Command, data []byte) [][]byte {
	var args [][]byte
	for _, w := range strings.Split(cmd.Name, "|") {
		args = append(args, []byte(w))
	}
	if len(data) == 0 {
		return args
	}
	for i, p := range bytes.Split(data, []byte{0xff}) {
		if i >= 24 {
			break
		}
		if len(p) == 1 && int(p[0]) < len(fuzzWords) {
			p = []byte(fuzzWords[p[0]])
		}
		args = append(args, p)
	}
	return args
}

// FuzzNoKeyEscapes checks the namespace's one promise: for any command of
// the table with any arguments, every key the command table finds in what
// is forwarded starts with the prefix, and so does every channel and SCAN
// pattern; the client's arguments are never modified.
func FuzzNoKeyEscapes(f *testing.F) {
	all := allCommands()
	f.Add(uint16(0), []byte("k"))
	for i, c := range all {
		switch c.Name {
		case "sort", "xread", "xreadgroup", "georadius", "migrate", "eval", "scan", "zunionstore", "publish", "psubscribe", "blmpop", "object|encoding":
			f.Add(uint16(i), []byte("a\xffb\xff\x00\xffc\xff\x01\xff\x02\xffd"))
			f.Add(uint16(i), []byte("\x02\xff\x09\xff\x0a\xffk1\xffk2\xff0\xff0"))
		}
	}
	ns, err := New("tenant:")
	if err != nil {
		f.Fatal(err)
	}
	w := NewRewriter(ns)
	table := commands.Builtin()
	f.Fuzz(func(t *testing.T, pick uint16, data []byte) {
		cmd := all[int(pick)%len(all)]
		args := fuzzArgs(cmd, data)
		before := make([][]byte, len(args))
		for i, a := range args {
			before[i] = append([]byte(nil), a...)
		}
		looked := table.Lookup(args)
		w.Reset()
		out, res := w.Rewrite(looked, args)
		for i := range args {
			if !bytes.Equal(args[i], before[i]) {
				t.Fatalf("%s: Rewrite modified the client's argument %d: %q -> %q", cmd.Name, i, before[i], args[i])
			}
		}
		if looked == nil || !looked.ArityOK(len(args)) {
			return // Redis refuses it before reading any key
		}
		if res.Action == Refuse {
			if !strings.HasPrefix(res.Err, "ERR redproxy: ") {
				t.Fatalf("%s: refusal %q is not a Redis-style error", cmd.Name, res.Err)
			}
			return
		}
		if res.Action != Forward {
			if looked.Name != "flushdb" && looked.Name != "randomkey" {
				t.Fatalf("%s: emulated (%d), only FLUSHDB and RANDOMKEY are", looked.Name, res.Action)
			}
			return
		}
		for _, i := range looked.Keys(out, nil) {
			if !bytes.HasPrefix(out[i], []byte("tenant:")) {
				t.Fatalf("%s %q: key %d %q escapes the namespace (rewritten: %q)", looked.Name, args, i, out[i], out)
			}
		}
		inNS := func(ch []byte) bool {
			if bytes.HasPrefix(ch, keyeventPrefix) {
				return true // shared channel; messages are filtered on the way out
			}
			_, ok := ns.StripChannel(ch)
			return ok
		}
		switch looked.Name {
		case "subscribe", "ssubscribe", "psubscribe", "unsubscribe", "sunsubscribe", "punsubscribe", "pubsub|numsub", "pubsub|shardnumsub":
			from := 1
			if looked.Parent != nil {
				from = 2
			}
			for _, ch := range out[min(from, len(out)):] {
				if !inNS(ch) {
					t.Fatalf("%s: channel %q escapes the namespace", looked.Name, ch)
				}
			}
		case "publish", "spublish":
			if len(out) > 1 {
				if _, ok := ns.StripChannel(out[1]); !ok {
					t.Fatalf("PUBLISH to %q escapes the namespace", out[1])
				}
			}
		case "scan":
			if len(args)%2 != 0 {
				return // Redis: syntax error
			}
			last := []byte(nil)
			for i := 2; i+1 < len(out); i += 2 {
				if commands.EqualFold("match", out[i]) {
					last = out[i+1]
				}
			}
			if !bytes.HasPrefix(last, []byte("tenant:")) {
				t.Fatalf("SCAN %q: MATCH pattern %q is not confined", args, last)
			}
		case "keys":
			if len(out) > 1 && !bytes.HasPrefix(out[1], []byte("tenant:")) {
				t.Fatalf("KEYS pattern %q is not confined", out[1])
			}
		}
	})
}
