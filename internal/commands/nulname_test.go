package commands

import (
	"bytes"
	"testing"
)

// Redis compares command names with strcasecmp, which stops at a NUL byte,
// while it hashes the whole name: "KEYS\x00x" may run as KEYS. NULName
// flags every name the table did not find because of what follows a NUL.
func TestNULName(t *testing.T) {
	tab := Builtin()
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"KEYS\x00x", "*"}, 0},
		{[]string{"keys\x00", "*"}, 0},
		{[]string{"SELECT\x0017", "9"}, 0},
		{[]string{"\x00"}, 0},
		{[]string{"CONFIG\x00x", "SET", "a", "b"}, 0},
		{[]string{"CONFIG", "SET\x00x", "a", "b"}, 1},
		{[]string{"client", "setname\x00", "x"}, 1},
		{[]string{"OBJECT", "\x00", "k"}, 1},
		// Known commands: a NUL in an argument is data.
		{[]string{"KEYS", "a\x00b"}, -1},
		{[]string{"GET", "k\x00"}, -1},
		{[]string{"SET", "k", "v", "EX\x00", "1"}, -1},
		{[]string{"CONFIG", "GET", "a\x00"}, -1},
		// Unknown without a NUL: forwarded, Redis answers.
		{[]string{"NOSUCH", "a\x00"}, -1},
		{[]string{"CONFIG", "NOSUCH"}, -1},
		{[]string{"CONFIG"}, -1},
		{nil, -1},
	}
	for _, tc := range cases {
		var args [][]byte
		for _, a := range tc.args {
			args = append(args, []byte(a))
		}
		if got := NULName(tab.Lookup(args), args); got != tc.want {
			t.Errorf("NULName(%q) = %d, want %d", tc.args, got, tc.want)
		}
	}
}

// FuzzNULName: whenever NULName lets a command through (-1), the command
// Redis would find comparing names up to their first NUL is the one
// Lookup found, so the proxy and Redis agree on what runs.
func FuzzNULName(f *testing.F) {
	f.Add("KEYS\x00136", "*")
	f.Add("FLUSHALL\x00516", "")
	f.Add("select\x00266", "9")
	f.Add("CONFIG", "SET\x004")
	f.Add("Client", "KILL\x00")
	f.Add("GET", "k\x00")
	f.Add("nosuch", "x")
	tab := Builtin()
	cut := func(s string) []byte {
		if i := bytes.IndexByte([]byte(s), 0); i >= 0 {
			s = s[:i]
		}
		return []byte(s)
	}
	f.Fuzz(func(t *testing.T, name, sub string) {
		args := [][]byte{[]byte(name), []byte(sub)}
		c := tab.Lookup(args)
		n := NULName(c, args)
		if n < 0 {
			if redis := tab.Lookup([][]byte{cut(name), cut(sub)}); redis != c {
				t.Fatalf("%q: NULName lets it through as %v, Redis may run %v", args, c, redis)
			}
			return
		}
		if n > 1 || !bytes.Contains(args[n], []byte{0}) {
			t.Fatalf("%q: NULName = %d", args, n)
		}
	})
}
