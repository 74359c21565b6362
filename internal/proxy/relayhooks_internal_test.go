package proxy

import "testing"

// The relay's reply counter finds every top-level reply of a RESP3 stream
// however it is cut, and does not count pushes.
func TestReplyCounterAnySplit(t *testing.T) {
	stream := "+OK\r\n" +
		">3\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n$0\r\n\r\n" + // a push: not a reply
		"$5\r\nhello\r\n" +
		"*2\r\n*1\r\n:1\r\n%1\r\n+a\r\n$-1\r\n" +
		"_\r\n" +
		"-ERR x\r\n" +
		"*0\r\n" +
		">2\r\n$7\r\nmessage\r\n$2\r\nhi\r\n" +
		"=7\r\ntxt:abc\r\n"
	const want = 7
	for step := 1; step <= len(stream); step++ {
		var c replyCounter
		var got int64
		for i := 0; i < len(stream); i += step {
			n, ok := c.feed([]byte(stream[i:min(i+step, len(stream))]))
			if !ok {
				t.Fatalf("step %d: not understood at %d", step, i)
			}
			got += n
		}
		if got != want {
			t.Fatalf("step %d: counted %d replies, want %d", step, got, want)
		}
	}
}
