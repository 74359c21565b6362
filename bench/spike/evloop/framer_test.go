package main

import (
	"testing"
)

func TestFrameReply(t *testing.T) {
	complete := []string{
		"+OK\r\n",
		"-ERR x\r\n",
		":12\r\n",
		"$-1\r\n",
		"$0\r\n\r\n",
		"$5\r\nhe\r\nx\r\n", // a CRLF inside a value is data
		"*-1\r\n",
		"*0\r\n",
		"*2\r\n$1\r\na\r\n*2\r\n:1\r\n*1\r\n+x\r\n",
		"%1\r\n+k\r\n*1\r\n_\r\n",
		"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n", // attribute, then its value
		">2\r\n+message\r\n,1.5\r\n",
	}
	for _, reply := range complete {
		b := []byte(reply + "+NEXT\r\n")
		n, _, err := frameReply(b)
		if err != nil || n != len(reply) {
			t.Errorf("%q: n=%d err=%v, want %d", reply, n, err, len(reply))
		}
		// Every proper prefix is incomplete, never an error.
		for i := 0; i < len(reply); i++ {
			if n, _, err := frameReply([]byte(reply[:i])); n != 0 || err != nil {
				t.Errorf("%q cut at %d: n=%d err=%v, want incomplete", reply, i, n, err)
			}
		}
	}
	if _, need, _ := frameReply([]byte("$100\r\nabc")); need != 108 {
		t.Errorf("need = %d, want 106", need)
	}
	if _, _, err := frameReply([]byte("?\r\n")); err == nil {
		t.Error("unknown type byte: want an error")
	}
}

func TestFrameRequest(t *testing.T) {
	cases := []struct {
		in     string
		n      int
		name   string
		inline bool
		err    error
	}{
		{"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n+", 20, "GET", false, nil},
		{"*2\r\n$3\r\nGET\r\n$1\r\nk\r", 0, "", false, nil},
		{"*0\r\n", 4, "", false, nil},
		{"get k\r\nx", 7, "get", true, nil},
		{"  \r\n", 4, "", true, nil},
		{"*x\r\n", 0, "", false, errInvalidMultibulk},
		{"*1\r\n:1\r\n", 0, "", false, errExpectedBulk},
		{"*1\r\n$-1\r\n", 0, "", false, errInvalidBulk},
		{"*1\r\n$999999999999\r\n", 0, "", false, errInvalidBulk},
	}
	for _, c := range cases {
		n, name, inline, _, err := frameRequest([]byte(c.in))
		if n != c.n || string(name) != c.name || inline != c.inline || err != c.err {
			t.Errorf("%q: got n=%d name=%q inline=%v err=%v; want %d %q %v %v",
				c.in, n, name, inline, err, c.n, c.name, c.inline, c.err)
		}
	}
	if _, _, _, need, _ := frameRequest([]byte("*2\r\n$3\r\nSET\r\n$10\r\nab")); need != 30 {
		t.Errorf("need = %d, want 29", need)
	}
	long := make([]byte, maxInline+1)
	for i := range long {
		long[i] = 'a'
	}
	if _, _, _, _, err := frameRequest(long); err != errInlineTooBig {
		t.Errorf("inline without a newline past %d bytes: err=%v", maxInline, err)
	}
}
