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
	// Push frames Redis writes inside a reply (RESP3, DEBUG PROTOCOL push
	// in MULTI): no element of the array they interrupt.
	"*1\r\n>2\r\n$16\r\nserver-cpu-usage\r\n:42\r\n$4\r\nreal\r\n",
	"*2\r\n:1\r\n>1\r\n:7\r\n>1\r\n*1\r\n:8\r\n+two\r\n",
	"*1\r\n*1\r\n>1\r\n:7\r\n:1\r\n",
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
		// Streamed in pieces of cut bytes, Consume frames it alike,
		// holding little; it may refuse an incomplete reply early (a
		// header line longer than any valid one).
		chunk := max(int(cut), 1)
		cn, cdone, held, cerr := consume(b, chunk)
		switch {
		case err != nil && cerr == nil, err == nil && n > 0 && (cerr != nil || !cdone || cn != n), err == nil && n == 0 && cdone:
			t.Fatalf("Consume in pieces of %d: %d,%v,%v; Scan %d,%v", chunk, cn, cdone, cerr, n, err)
		case held > chunk+maxStreamedHeader:
			t.Fatalf("Consume in pieces of %d held %d bytes", chunk, held)
		}
		if err == nil && n > 0 {
			// The framed reply alone must frame to itself.
			if m, err := ScanReply(b[:n]); err != nil || m != n {
				t.Fatalf("reframe: %d %v", m, err)
			}
		}
	})
}

// consume feeds b to a Consume-driven reader that gets chunk bytes per
// read and drops what Consume releases, as a caller streaming a reply too
// big to hold does. It returns the bytes of b the reply took (when done),
// and the most the reader had to hold at once.
func consume(b []byte, chunk int) (n int, done bool, held int, err error) {
	var s ReplyScanner
	var buf []byte
	released := 0
	for off := 0; off < len(b); {
		end := min(len(b), off+chunk)
		buf = append(buf, b[off:end]...)
		off = end
		held = max(held, len(buf))
		k, done, err := s.Consume(buf)
		if err != nil {
			return 0, false, held, err
		}
		released += k
		buf = buf[k:]
		if done {
			return released, true, held, nil
		}
	}
	return 0, false, held, nil
}

// Consume frames every reply where Scan does, read in pieces of any size,
// and leaves what follows the reply alone.
func TestConsumeFramesLikeScan(t *testing.T) {
	for _, r := range validReplies {
		b := []byte(r + "+NEXT\r\n")
		for chunk := 1; chunk <= len(b); chunk++ {
			n, done, _, err := consume(b, chunk)
			if err != nil || !done || n != len(r) {
				t.Fatalf("%q in pieces of %d: %d, %v, %v; want %d, done", r, chunk, n, done, err, len(r))
			}
		}
		// Continuing Scan calls that found the reply incomplete.
		for cut := 1; cut < len(r); cut++ {
			var s ReplyScanner
			if n, err := s.Scan([]byte(r[:cut])); n != 0 || err != nil {
				t.Fatalf("%q cut at %d: Scan %d, %v", r, cut, n, err)
			}
			k, done, err := s.Consume(b)
			if err != nil || !done || k != len(r) {
				t.Fatalf("%q: Consume after Scan of %d bytes: %d, %v, %v; want %d, done", r, cut, k, done, err, len(r))
			}
		}
	}
	for _, r := range []string{
		"?\r\n", "$abc\r\n", "$-2\r\n", "*-2\r\n", "$3\r\nfooXY", "+a\rb\r\n",
		"%-1\r\n", "_x\r\n", "~-1\r\n", "!-1\r\n", "$2\r\nab\r\r",
	} {
		for chunk := 1; chunk <= len(r); chunk++ {
			if _, _, _, err := consume([]byte(r), chunk); !errors.Is(err, ErrProtocol) {
				t.Errorf("%q in pieces of %d: err %v, want ErrProtocol", r, chunk, err)
			}
		}
	}
}

// Whatever a reply's size, or the size it claims, Consume holds no more
// than a header line of it: a 16 MB string, a big aggregate and a long
// line pass through, a huge declared length that never comes stays
// incomplete without holding anything, and a header line longer than any
// valid one is refused rather than waited for.
func TestConsumeHoldsLittle(t *testing.T) {
	const chunk = 4096
	var agg bytes.Buffer
	agg.WriteString("*2\r\n*100000\r\n")
	for range 100000 {
		agg.WriteString("$3\r\nabc\r\n")
	}
	agg.WriteString("%1\r\n+" + strings.Repeat("l", 100000) + "\r\n$5\r\nhello\r\n")
	const size = 16 << 20
	big := append([]byte("$16777216\r\n"), make([]byte, size)...)
	big = append(big, "\r\n+NEXT\r\n"...)
	for _, c := range []struct {
		name string
		b    []byte
		n    int // 0: incomplete
	}{
		{"16 MB string", big, len(big) - len("+NEXT\r\n")},
		{"aggregate", agg.Bytes(), agg.Len()},
		{"huge declared length", append([]byte("$999999999999999999\r\n"), make([]byte, 1<<20)...), 0},
		{"huge declared count", append([]byte("*1099511627776\r\n"), bytes.Repeat([]byte(":1\r\n"), 1<<16)...), 0},
		{"endless line", append([]byte("-ERR "), bytes.Repeat([]byte("e"), 1<<20)...), 0},
	} {
		n, done, held, err := consume(c.b, chunk)
		if err != nil || done != (c.n > 0) || n != c.n {
			t.Errorf("%s: %d, %v, %v; want %d", c.name, n, done, err, c.n)
		}
		if held > chunk+maxStreamedHeader {
			t.Errorf("%s: held %d bytes at once; want at most %d", c.name, held, chunk+maxStreamedHeader)
		}
	}
	for _, r := range []string{"$" + strings.Repeat("1", 40), "_" + strings.Repeat(" ", 40), "*" + strings.Repeat("9", 31) + "\r\n"} {
		if _, _, _, err := consume([]byte(r), 1); !errors.Is(err, ErrProtocol) {
			t.Errorf("%.10q...: err %v, want ErrProtocol", r, err)
		}
	}
}

func TestBulkHeader(t *testing.T) {
	for _, c := range []struct {
		in           string
		size, header int
		ok           bool
	}{
		{"$5\r\nhello\r\n", 5, 4, true},
		{"$100000\r\nxx", 100000, 9, true},
		{"$0\r\n\r\n", 0, 4, true},
		{"$-1\r\n", 0, 0, false},
		{"$12", 0, 0, false},
		{"$12\r", 0, 0, false},
		{"+OK\r\n", 0, 0, false},
		{"$05\r\nhello\r\n", 0, 0, false},
		{"$1\rx\n", 0, 0, false},
	} {
		size, header, ok := BulkHeader([]byte(c.in))
		if int(size) != c.size || header != c.header || ok != c.ok {
			t.Errorf("BulkHeader(%q) = %d, %d, %v; want %d, %d, %v", c.in, size, header, ok, c.size, c.header, c.ok)
		}
	}
}

// ScanElement reports the push frames before an element apart from it.
func TestScanElementSkipsPushFrames(t *testing.T) {
	b := []byte(">1\r\n:7\r\n>2\r\n+a\r\n+b\r\n$4\r\nreal\r\n:9\r\n")
	push, n, err := ScanElement(b)
	if err != nil || push != len(">1\r\n:7\r\n>2\r\n+a\r\n+b\r\n") || string(b[push:push+n]) != "$4\r\nreal\r\n" {
		t.Fatalf("ScanElement = %d, %d, %v", push, n, err)
	}
	if push, n, err := ScanElement([]byte(":1\r\n")); push != 0 || n != 4 || err != nil {
		t.Fatalf("an element without push frames: %d, %d, %v", push, n, err)
	}
	if els, ok := ArrayElements([]byte("*2\r\n:1\r\n>1\r\n:7\r\n+two\r\n")); !ok || len(els) != 2 || string(els[1]) != "+two\r\n" {
		t.Fatalf("ArrayElements with a push frame inside: %q, %v", els, ok)
	}
}
