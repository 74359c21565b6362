package resp

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tidwall/redcon"
)

var writeCases = [][]string{
	{"PING"},
	{"GET", "k"},
	{"SET", "key", ""},
	{"EXPIRE", "user:1", "86400", "NX"},
	{"SET", "bin\r\nkey\x00", strings.Repeat("v", 1000)},
	{"CLIENT", "SETNAME", "redproxy-pinned"},
}

// Every form writes what redcon's array and bulk writers write, and Redis's
// own request format reads it back as the same arguments.
func TestAppendCommandForms(t *testing.T) {
	for _, c := range writeCases {
		var want []byte
		want = redcon.AppendArray(want, len(c))
		args := make([][]byte, len(c))
		for i, a := range c {
			want = redcon.AppendBulkString(want, a)
			args[i] = []byte(a)
		}
		prefix := []byte("prefix")
		got := map[string][]byte{
			"AppendCommand":        AppendCommand(bytes.Clone(prefix), args...),
			"AppendCommandNamed":   AppendCommandNamed(bytes.Clone(prefix), c[0], args[1:]...),
			"AppendCommandStrings": AppendCommandStrings(bytes.Clone(prefix), c...),
		}
		for name, b := range got {
			if !bytes.HasPrefix(b, prefix) {
				t.Fatalf("%s(%q) overwrote dst: %q", name, c, b)
			}
			b = b[len(prefix):]
			if !bytes.Equal(b, want) {
				t.Fatalf("%s(%q) = %q, want %q", name, c, b, want)
			}
			complete, parsed, _, left, err := redcon.ReadNextCommand(b, nil)
			if err != nil || !complete || len(left) != 0 {
				t.Fatalf("%s(%q): read back complete=%v left=%q err=%v", name, c, complete, left, err)
			}
			if len(parsed) != len(c) {
				t.Fatalf("%s(%q): read back %d args", name, c, len(parsed))
			}
			for i := range c {
				if string(parsed[i]) != c[i] {
					t.Fatalf("%s(%q): arg %d read back as %q", name, c, i, parsed[i])
				}
			}
		}
	}
}

func TestAppendCommandEmpty(t *testing.T) {
	if got := string(AppendCommand(nil)); got != "*0\r\n" {
		t.Fatalf("AppendCommand() = %q", got)
	}
	if got := string(AppendCommandStrings(nil)); got != "*0\r\n" {
		t.Fatalf("AppendCommandStrings() = %q", got)
	}
}

// The proxy writes commands on its hot paths (fix-ups, shared fetches) into
// buffers it reuses: with room in dst, no form allocates.
func TestAppendCommandNoAllocs(t *testing.T) {
	key, secs, nx := []byte("user:1"), []byte("86400"), []byte("NX")
	expire := []byte("EXPIRE")
	dst := make([]byte, 0, 256)
	for name, f := range map[string]func(){
		"AppendCommand":        func() { dst = AppendCommand(dst[:0], expire, key, secs, nx) },
		"AppendCommandNamed":   func() { dst = AppendCommandNamed(dst[:0], "EXPIRE", key, secs, nx) },
		"AppendCommandStrings": func() { dst = AppendCommandStrings(dst[:0], "CLIENT", "SETNAME", "redproxy") },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations per call", name, n)
		}
	}
}

func BenchmarkAppendCommand(b *testing.B) {
	key, secs, nx := []byte("user:1000"), []byte("86400"), []byte("NX")
	expire := []byte("EXPIRE")
	dst := make([]byte, 0, 256)
	b.Run("args", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst = AppendCommand(dst[:0], expire, key, secs, nx)
		}
	})
	b.Run("named", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst = AppendCommandNamed(dst[:0], "EXPIRE", key, secs, nx)
		}
	})
	b.Run("strings", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst = AppendCommandStrings(dst[:0], "EXPIRE", "user:1000", "86400", "NX")
		}
	})
	b.Run("redcon", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst = redcon.AppendArray(dst[:0], 4)
			dst = redcon.AppendBulk(dst, expire)
			dst = redcon.AppendBulk(dst, key)
			dst = redcon.AppendBulk(dst, secs)
			dst = redcon.AppendBulk(dst, nx)
		}
	})
}

func TestInteger(t *testing.T) {
	for _, c := range []struct {
		reply string
		n     int64
		ok    bool
	}{
		{":0\r\n", 0, true}, {":42\r\n", 42, true}, {":-2\r\n", -2, true},
		{"$2\r\n42\r\n", 0, false}, {"-ERR x\r\n", 0, false}, {":x\r\n", 0, false}, {":\r\n", 0, false},
	} {
		if n, ok := Integer([]byte(c.reply)); n != c.n || ok != c.ok {
			t.Errorf("Integer(%q) = %d, %v; want %d, %v", c.reply, n, ok, c.n, c.ok)
		}
	}
	if n, ok := Integer(Ping); ok {
		t.Errorf("Integer(PING request) = %d, true", n)
	}
}
