package proxy_test

// Found by the tools review: an inline (telnet-style) command whose line is
// 65,535 bytes before its CRLF. Redis refuses an inline request only when
// more than 64 KB (PROTO_INLINE_MAX_SIZE, 65,536) are buffered with no
// newline among them (networking.c, processInlineBuffer: "sdslen(querybuf)
// - qb_pos > PROTO_INLINE_MAX_SIZE"), so a line whose '\n' is the
// 65,537th byte is always accepted, whatever the reads. The proxy looked
// for the newline only in the first max_inline_bytes (64 KB) bytes
// (internal/resp/request.go, parseInline), and refused it with "too big
// inline request", closing the connection. (Redis in practice also accepts longer lines,
// up to about 80 KB, when the newline arrives in the same 16 KB read that
// passes 64 KB; that part depends on how the bytes are read.)
//
//	python3 -c "import sys; sys.stdout.buffer.write(b'ECHO '+b'a'*65530+b'\r\n')" | nc <redis> -> $65530 ...
//	the same through the proxy                                                    -> -ERR Protocol error: too big inline request

import (
	"bufio"
	"strings"
	"testing"
	"time"
)

func TestReviewToolsInlineLineAtRedisLimit(t *testing.T) {
	_, p, direct := newDirectPair(t)
	line := "ECHO " + strings.Repeat("a", 65530) + "\r\n" // '\n' is byte 65,537
	first := func(addr string) string {
		nc := dialAddr(t, addr)
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write([]byte(line + "PING\r\n")); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(nc).ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		return got
	}
	want, got := first(direct.Addr()), first(p.Addr)
	if want != "$65530\r\n" {
		t.Fatalf("Redis answered %q", want)
	}
	if got != want {
		t.Errorf("an inline ECHO of 65,535 bytes before CRLF: Redis answers %q, the proxy %q", want, got)
	}
}
