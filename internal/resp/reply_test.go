package resp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var validReplies = []string{
	"+OK\r\n",
	"-ERR unknown command\r\n",
	":12345\r\n",
	":-1\r\n",
	"$5\r\nhello\r\n",
	"$0\r\n\r\n",
	"$-1\r\n",
	"$4\r\na\r\nb\r\n", // CRLF inside a bulk is data
	"*-1\r\n",
	"*0\r\n",
	"*2\r\n$3\r\nfoo\r\n:1\r\n",
	"*3\r\n*2\r\n+a\r\n+b\r\n*0\r\n$-1\r\n",
	"_\r\n",
	",3.14\r\n",
	"#t\r\n",
	"(3492890328409238509324850943850943825024385\r\n",
	"!21\r\nSYNTAX invalid syntax\r\n",
	"=15\r\ntxt:Some string\r\n",
	"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n",
	"~3\r\n+a\r\n+b\r\n+c\r\n",
	">3\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nfoo\r\n$0\r\n\r\n",
	"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*2\r\n:2039123\r\n:9543892\r\n",
	"*1\r\n|1\r\n+ttl\r\n:3600\r\n$2\r\nok\r\n",
}

func TestScanReplyComplete(t *testing.T) {
	for _, r := range validReplies {
		// A trailing second reply must not be consumed.
		b := []byte(r + "+NEXT\r\n")
		n, err := ScanReply(b)
		if err != nil || n != len(r) {
			t.Errorf("ScanReply(%q) = %d, %v; want %d, nil", r, n, err, len(r))
		}
	}
}

// Every proper prefix of a reply is incomplete, and a resumable scanner fed
// the reply one byte at a time finds the same end: the property a reader
// relies on when replies are split across TCP reads.
func TestScanReplySplitEverywhere(t *testing.T) {
	for _, r := range validReplies {
		for i := 0; i < len(r); i++ {
			if n, err := ScanReply([]byte(r[:i])); n != 0 || err != nil {
				t.Fatalf("prefix %q of %q: got %d, %v; want incomplete", r[:i], r, n, err)
			}
		}
		var s ReplyScanner
		got := 0
		for i := 1; i <= len(r); i++ {
			n, err := s.Scan([]byte(r[:i]))
			if err != nil {
				t.Fatalf("%q byte by byte: %v", r, err)
			}
			if n != 0 {
				if i != len(r) {
					t.Fatalf("%q byte by byte: complete after %d bytes", r, i)
				}
				got = n
			}
		}
		if got != len(r) {
			t.Fatalf("%q byte by byte: got %d", r, got)
		}
	}
}

func TestScanReplyMalformed(t *testing.T) {
	for _, r := range []string{
		"?\r\n", "$abc\r\n", "$-2\r\n", "*-2\r\n", "$3\r\nfooXY", "+a\rb\r\n",
		"%-1\r\n", "_x\r\n", "~-1\r\n",
	} {
		if _, err := ScanReply([]byte(r)); !errors.Is(err, ErrProtocol) {
			t.Errorf("ScanReply(%q): err %v, want ErrProtocol", r, err)
		}
	}
}

// A large aggregate arriving in chunks is scanned in time linear in its
// size; this checks the resumed scan gives the same answer as a single scan.
func TestScanReplyLargeAggregateResumed(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("*100000\r\n")
	for i := 0; i < 100000; i++ {
		b.WriteString("$3\r\nabc\r\n")
	}
	all := b.Bytes()
	var s ReplyScanner
	for end := 4096; ; end += 4096 {
		if end > len(all) {
			end = len(all)
		}
		n, err := s.Scan(all[:end])
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			if n != len(all) {
				t.Fatalf("n=%d want %d", n, len(all))
			}
			return
		}
		if end == len(all) {
			t.Fatal("never completed")
		}
	}
}

func FuzzScanReply(f *testing.F) {
	for _, r := range validReplies {
		f.Add([]byte(r), uint8(3))
	}
	f.Add([]byte(strings.Repeat("*1\r\n", 300)+"-ERR deep\r\n"), uint8(200))
	f.Add([]byte(strings.Repeat("*2\r\n|1\r\n+a\r\n:1\r\n", 40)+":1\r\n"+strings.Repeat("_\r\n", 40)), uint8(77))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		n, err := ScanReply(b)
		if n < 0 || n > len(b) {
			t.Fatalf("n=%d out of range for %d bytes", n, len(b))
		}
		if err != nil && n != 0 {
			t.Fatalf("error with n=%d", n)
		}
		// The counting scanner must agree with a plain recursive framer.
		if rn, rerr := refScan(b); (rerr == nil) != (err == nil) || rn != n {
			t.Fatalf("reference framer: %d,%v; scanner %d,%v", rn, rerr, n, err)
		}
		// Resuming after a split must agree with the one-shot scan.
		c := int(cut)
		if c > len(b) {
			c = len(b)
		}
		var s ReplyScanner
		n1, err1 := s.Scan(b[:c])
		if err1 == nil && n1 == 0 {
			n1, err1 = s.Scan(b)
		}
		if (err1 == nil) != (err == nil) || (err == nil && n1 != n) {
			t.Fatalf("split at %d: got %d,%v; one-shot %d,%v", c, n1, err1, n, err)
		}
		if err == nil && n > 0 {
			// The framed reply alone must frame to itself.
			if m, err := ScanReply(b[:n]); err != nil || m != n {
				t.Fatalf("reframe: %d %v", m, err)
			}
		}
	})
}
