package namespace

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/redproxy/redproxy/internal/resp"
)

// Each command of a transaction gets its own element of EXEC's reply
// stripped as its reply would be outside MULTI; the others, errors, and
// replies that are not arrays stay as Redis sent them.
func TestStripExec(t *testing.T) {
	ns, _ := New("t:")
	scan := "*2\r\n$1\r\n0\r\n*1\r\n$3\r\nt:a\r\n"
	pop := "*2\r\n$3\r\nt:l\r\n*1\r\n$1\r\nx\r\n"
	streams := "%1\r\n$3\r\nt:s\r\n*0\r\n"
	for _, c := range []struct {
		name    string
		in, out string
		strips  []TxStrip
	}{
		{"each its own", "*5\r\n+OK\r\n" + scan + "$3\r\nt:v\r\n" + pop + streams,
			"*5\r\n+OK\r\n*2\r\n$1\r\n0\r\n*1\r\n$1\r\na\r\n$3\r\nt:v\r\n*2\r\n$1\r\nl\r\n*1\r\n$1\r\nx\r\n%1\r\n$1\r\ns\r\n*0\r\n",
			[]TxStrip{{1, StripScan}, {3, StripFirst}, {4, StripStreams}}},
		{"a value naming a key is not a key", "*2\r\n$3\r\nt:v\r\n$3\r\nt:k\r\n", "*2\r\n$3\r\nt:v\r\n$1\r\nk\r\n",
			[]TxStrip{{1, StripBulk}}},
		{"an error element", "*2\r\n-WRONGTYPE t:k\r\n$3\r\nt:k\r\n", "*2\r\n-WRONGTYPE t:k\r\n$1\r\nk\r\n",
			[]TxStrip{{0, StripBulk}, {1, StripBulk}}},
		// A push Redis wrote inside the reply is no element (review).
		{"a push inside", "*2\r\n$3\r\nt:v\r\n>2\r\n$1\r\np\r\n:1\r\n$3\r\nt:k\r\n", "*2\r\n$3\r\nt:v\r\n>2\r\n$1\r\np\r\n:1\r\n$1\r\nk\r\n",
			[]TxStrip{{1, StripBulk}}},
		{"WATCH failed", "*-1\r\n", "*-1\r\n", []TxStrip{{0, StripBulk}}},
		{"WATCH failed, RESP3", "_\r\n", "_\r\n", []TxStrip{{0, StripBulk}}},
		{"EXECABORT", "-EXECABORT Transaction discarded because of previous errors.\r\n", "-EXECABORT Transaction discarded because of previous errors.\r\n", []TxStrip{{0, StripBulk}}},
		{"empty", "*0\r\n", "*0\r\n", []TxStrip{{0, StripBulk}}},
		{"strip past the end", "*1\r\n$3\r\nt:k\r\n", "*1\r\n$3\r\nt:k\r\n", []TxStrip{{1, StripBulk}}},
		{"truncated", "*2\r\n$3\r\nt:k\r\n", "*2\r\n$3\r\nt:k\r\n", []TxStrip{{0, StripBulk}}},
	} {
		if got := string(ns.StripExec([]byte("prev"), []byte(c.in), c.strips)); got != "prev"+c.out {
			t.Errorf("%s: %q, want %q", c.name, got, "prev"+c.out)
		}
	}
}

// FuzzStripExec checks EXEC's stripping against the stripping of each
// reply on its own: a transaction's reply is the command replies
// concatenated, so stripping it must give exactly what the same commands
// answer outside MULTI. Names of another namespace are never touched, and
// the result is always one well-formed reply.
func FuzzStripExec(f *testing.F) {
	f.Add([]byte("\x01\x02k\x00\x03v\x04\x05s"))
	f.Add([]byte("\x06b:k\x01\x07\x02t:a"))
	ns, _ := New("t:")
	kinds := []Strip{StripNone, StripScan, StripKeys, StripBulk, StripFirst, StripStreams, StripChannels, StripPairs}
	f.Fuzz(func(t *testing.T, data []byte) {
		// data describes the transaction: a byte picks an element shape
		// and its strip, the following name bytes up to a byte below 16.
		var elems [][]byte
		var strips []TxStrip
		for len(data) > 0 && len(elems) < 32 {
			op := data[0]
			data = data[1:]
			end := bytes.IndexFunc(data, func(r rune) bool { return r < 16 })
			if end < 0 {
				end = len(data)
			}
			name := string(data[:end])
			data = data[end:]
			if op%3 == 0 {
				name = "t:" + name
			} else if op%3 == 1 {
				name = "other:" + name
			}
			kind := kinds[int(op>>3)%len(kinds)]
			elems = append(elems, fuzzElement(op, name))
			if kind != StripNone {
				strips = append(strips, TxStrip{Pos: len(elems) - 1, Kind: kind})
			}
		}
		exec := resp.AppendArray(nil, len(elems))
		want := resp.AppendArray(nil, len(elems))
		s := 0
		for i, e := range elems {
			exec = append(exec, e...)
			if s < len(strips) && strips[s].Pos == i {
				if resp.IsError(e) {
					want = append(want, e...)
				} else {
					want = ns.StripReply(want, strips[s].Kind, e)
				}
				s++
			} else {
				want = append(want, e...)
			}
		}
		got := ns.StripExec(nil, exec, strips)
		if !bytes.Equal(got, want) {
			t.Fatalf("EXEC %q with %v:\n got %q\nwant %q", exec, strips, got, want)
		}
		if n, err := resp.ScanReply(got); err != nil || n != len(got) {
			t.Fatalf("stripped EXEC reply %q is not one reply (%d, %v)", got, n, err)
		}
		if bytes.Count(got, []byte("other:")) != bytes.Count(exec, []byte("other:")) {
			t.Fatalf("a name of another namespace changed: %q -> %q", exec, got)
		}
	})
}

// fuzzElement is one command's reply in a shape op picks, naming name.
func fuzzElement(op byte, name string) []byte {
	bulk := func(s string) []byte { return []byte("$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n") }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	switch (op >> 1) % 8 {
	case 0:
		return bulk(name)
	case 1:
		return cat([]byte("*2\r\n"), bulk("0"), []byte("*2\r\n"), bulk(name), bulk(name))
	case 2:
		return cat([]byte("*2\r\n"), bulk(name), []byte("*1\r\n"), bulk("x"))
	case 3:
		return cat([]byte("%1\r\n"), bulk(name), []byte("*0\r\n"))
	case 4:
		return cat([]byte("*1\r\n*2\r\n"), bulk(name), []byte("*0\r\n"))
	case 5:
		return []byte("-ERR " + name + "\r\n")
	case 6:
		return []byte("*-1\r\n")
	}
	return cat([]byte("*4\r\n"), bulk(name), []byte(":1\r\n"), bulk(name), []byte(":0\r\n"))
}
