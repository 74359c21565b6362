package resp

import (
	"strings"
	"testing"
)

// The replies that dominate a cache proxy's traffic: framing them is on the
// path of every command, so it must stay allocation-free and cheap.
var benchReplies = []struct {
	name  string
	reply string
}{
	{"ok", "+OK\r\n"},
	{"int", ":12345\r\n"},
	{"bulk", "$5\r\nhello\r\n"},
	{"null", "$-1\r\n"},
	{"array3", "*3\r\n$3\r\nfoo\r\n:1\r\n$-1\r\n"},
	{"map2", "%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n"},
	{"nested", "*2\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n*2\r\n$1\r\nc\r\n$1\r\nd\r\n"},
	{"array100", "*100\r\n" + strings.Repeat("$3\r\nabc\r\n", 100)},
}

func BenchmarkScanReply(b *testing.B) {
	for _, r := range benchReplies {
		buf := []byte(r.reply)
		b.Run(r.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			var s ReplyScanner
			for b.Loop() {
				if n, err := s.Scan(buf); n != len(buf) || err != nil {
					b.Fatal(n, err)
				}
			}
		})
	}
}

// ScanReply, the one-shot form, is what the session uses to split EXEC and
// wrapped replies; its scanner lives on the stack for each call.
func BenchmarkScanReplyOneShot(b *testing.B) {
	for _, r := range benchReplies[:5] {
		buf := []byte(r.reply)
		b.Run(r.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if n, err := ScanReply(buf); n != len(buf) || err != nil {
					b.Fatal(n, err)
				}
			}
		})
	}
}
