package proxyproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/iotest"
)

// v2Header builds a version 2 header: command (0 LOCAL, 1 PROXY), family
// byte, and the payload (addresses then TLVs).
func v2Header(cmd, fam byte, payload []byte) []byte {
	b := append([]byte(nil), v2Signature...)
	b = append(b, 0x20|cmd, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	return append(b, payload...)
}

func tlv(typ byte, v string) []byte {
	b := []byte{typ}
	b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}

func TestParseV1(t *testing.T) {
	for _, tt := range []struct {
		in       string
		src, dst string // "" when the header carries no address
	}{
		{"PROXY TCP4 192.0.2.10 198.51.100.1 56324 6380\r\n", "192.0.2.10:56324", "198.51.100.1:6380"},
		{"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n", "[2001:db8::1]:1", "[2001:db8::2]:65535"},
		{"PROXY UNKNOWN\r\n", "", ""},
		{"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n", "", ""},
	} {
		in := tt.in + "PING\r\n"
		h, n, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", tt.in, err)
		}
		if n != len(tt.in) || h.Version != 1 {
			t.Errorf("%q: length %d version %d, want %d and 1", tt.in, n, h.Version, len(tt.in))
		}
		if got := addrString(h.Source); got != tt.src {
			t.Errorf("%q: source %q, want %q", tt.in, got, tt.src)
		}
		if got := addrString(h.Destination); got != tt.dst {
			t.Errorf("%q: destination %q, want %q", tt.in, got, tt.dst)
		}
	}
}

func addrString(a *net.TCPAddr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

func TestParseV1Invalid(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want error
	}{
		{"PROXY TCP4 192.0.2.10 198.51.100.1 56324\r\n", ErrInvalid},
		{"PROXY TCP4 2001:db8::1 198.51.100.1 1 2\r\n", ErrInvalid},        // IPv6 under TCP4
		{"PROXY TCP6 192.0.2.10 2001:db8::1 1 2\r\n", ErrInvalid},          // IPv4 under TCP6
		{"PROXY TCP6 ::ffff:192.0.2.1 2001:db8::1 1 2\r\n", ErrInvalid},    // mapped IPv4 under TCP6
		{"PROXY TCP4 192.0.2.10 198.51.100.1 65536 1\r\n", ErrInvalid},     // port out of range
		{"PROXY TCP4 192.0.2.10 198.51.100.1 -1 1\r\n", ErrInvalid},        // not a number
		{"PROXY TCP4 192.0.2.10  198.51.100.1 1 1\r\n", ErrInvalid},        // double space
		{"PROXY TCP4 192.0.2.10 198.51.100.1 1 1\n", ErrInvalid},           // bare LF
		{"PROXY UDP4 192.0.2.10 198.51.100.1 1 1\r\n", ErrInvalid},         // not TCP
		{"PROXY UNKNOWN " + strings.Repeat("x", 100) + "\r\n", ErrTooLong}, // past 107 bytes
		{"PING\r\n", ErrNoHeader},
		{"*1\r\n$4\r\nPING\r\n", ErrNoHeader},
		{"PROXY TCP4 192.0.2.10", ErrIncomplete},
		{"PRO", ErrIncomplete},
		{"", ErrIncomplete},
	} {
		if _, _, err := Parse([]byte(tt.in)); err != tt.want {
			t.Errorf("%q: %v, want %v", tt.in, err, tt.want)
		}
	}
}

func TestParseV2(t *testing.T) {
	v4 := []byte{192, 0, 2, 10, 198, 51, 100, 1, 0xdc, 0x04, 0x18, 0xec}
	v6 := append(append(net.ParseIP("2001:db8::1").To16(), net.ParseIP("2001:db8::2").To16()...), 0, 1, 0xff, 0xff)
	tlvs := append(tlv(0x01, "redis"), tlv(0xEA, "vpce-0123")...)
	for _, tt := range []struct {
		name     string
		in       []byte
		src, dst string
		local    bool
		tlvs     int
	}{
		{"TCP over IPv4", v2Header(1, 0x11, v4), "192.0.2.10:56324", "198.51.100.1:6380", false, 0},
		{"TCP over IPv6 with TLVs", v2Header(1, 0x21, append(v6, tlvs...)), "[2001:db8::1]:1", "[2001:db8::2]:65535", false, 2},
		{"TCP over IPv4 with TLVs", v2Header(1, 0x11, append(v4, tlvs...)), "192.0.2.10:56324", "198.51.100.1:6380", false, 2},
		{"LOCAL", v2Header(0, 0x00, nil), "", "", true, 0},
		{"LOCAL with addresses and TLVs is skipped", v2Header(0, 0x11, append(v4, tlvs...)), "", "", true, 0},
		{"PROXY UNSPEC", v2Header(1, 0x00, nil), "", "", false, 0},
		{"UDP carries no TCP address", v2Header(1, 0x12, v4), "", "", false, 0},
		{"unix socket", v2Header(1, 0x31, make([]byte, 216)), "", "", false, 0},
	} {
		in := append(append([]byte(nil), tt.in...), "PING\r\n"...)
		h, n, err := Parse(in)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if n != len(tt.in) || h.Version != 2 || h.Local != tt.local || len(h.TLVs) != tt.tlvs {
			t.Errorf("%s: length %d version %d local %v tlvs %d", tt.name, n, h.Version, h.Local, len(h.TLVs))
		}
		if got := addrString(h.Source); got != tt.src {
			t.Errorf("%s: source %q, want %q", tt.name, got, tt.src)
		}
		if got := addrString(h.Destination); got != tt.dst {
			t.Errorf("%s: destination %q, want %q", tt.name, got, tt.dst)
		}
	}
	h, _, _ := Parse(v2Header(1, 0x21, append(v6, tlvs...)))
	if h.TLVs[0].Type != 0x01 || string(h.TLVs[0].Value) != "redis" || h.TLVs[1].Type != 0xEA || string(h.TLVs[1].Value) != "vpce-0123" {
		t.Errorf("TLVs %+v", h.TLVs)
	}
}

func TestParseV2Invalid(t *testing.T) {
	v4 := make([]byte, 12)
	bad := v2Header(1, 0x11, v4)
	bad[12] = 0x11 // version 1 in a version 2 header
	for _, tt := range []struct {
		name string
		in   []byte
		want error
	}{
		{"wrong version", bad, ErrInvalid},
		{"unknown command", v2Header(2, 0x11, v4), ErrInvalid},
		{"unknown family", v2Header(1, 0x41, v4), ErrInvalid},
		{"unknown transport", v2Header(1, 0x13, v4), ErrInvalid},
		{"address longer than payload", v2Header(1, 0x21, v4), ErrInvalid},
		{"truncated TLV", v2Header(1, 0x11, append(append([]byte(nil), v4...), 0x01, 0x00)), ErrInvalid},
		{"TLV longer than payload", v2Header(1, 0x11, append(append([]byte(nil), v4...), 0x01, 0x00, 0x09, 'x')), ErrInvalid},
		{"over the size cap", v2Header(1, 0x11, make([]byte, MaxV2Payload+1)), ErrTooLong},
		{"fixed part only", v2Header(1, 0x11, v4)[:15], ErrIncomplete},
		{"payload cut short", v2Header(1, 0x11, v4)[:20], ErrIncomplete},
		{"signature cut short", v2Signature[:7], ErrIncomplete},
	} {
		if _, _, err := Parse(tt.in); err != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// Read must hand back every byte it read past the header, whatever the
// reads' sizes: they are the client's first commands.
func TestReadKeepsBytesPastHeader(t *testing.T) {
	v4 := []byte{192, 0, 2, 10, 198, 51, 100, 1, 0xdc, 0x04, 0x18, 0xec}
	big := v2Header(1, 0x11, append(append([]byte(nil), v4...), tlv(0xE0, strings.Repeat("t", 1000))...))
	for _, hdr := range [][]byte{
		[]byte("PROXY TCP4 192.0.2.10 198.51.100.1 56324 6380\r\n"),
		v2Header(1, 0x11, v4),
		big,
	} {
		body := "*1\r\n$4\r\nPING\r\n" + strings.Repeat("x", 300)
		for _, r := range []io.Reader{
			bytes.NewReader(append(append([]byte(nil), hdr...), body...)),
			iotest.OneByteReader(bytes.NewReader(append(append([]byte(nil), hdr...), body...))),
		} {
			h, rest, err := Read(r)
			if err != nil {
				t.Fatalf("%q: %v", hdr[:16], err)
			}
			if addrString(h.Source) != "192.0.2.10:56324" {
				t.Errorf("source %v", h.Source)
			}
			tail, _ := io.ReadAll(r)
			if got := string(rest) + string(tail); got != body {
				t.Errorf("bytes after the header: %q, want %q", got, body)
			}
		}
	}
	if _, _, err := Read(strings.NewReader("PROXY TCP4 1.2")); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut-off header: %v", err)
	}
	if _, _, err := Read(strings.NewReader("GET k\r\n")); err != ErrNoHeader {
		t.Errorf("no header: %v", err)
	}
}

// FuzzParse checks that Parse never panics, never claims more bytes than
// it was given or more than the size caps, and that Read, fed the same
// bytes in small pieces, agrees with it.
func FuzzParse(f *testing.F) {
	v4 := []byte{192, 0, 2, 10, 198, 51, 100, 1, 0xdc, 0x04, 0x18, 0xec}
	for _, s := range [][]byte{
		[]byte("PROXY TCP4 192.0.2.10 198.51.100.1 56324 6380\r\nPING\r\n"),
		[]byte("PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n"),
		[]byte("PROXY UNKNOWN\r\n"),
		v2Header(1, 0x11, v4),
		v2Header(1, 0x11, append(append([]byte(nil), v4...), tlv(0x01, "h2")...)),
		v2Header(0, 0x00, nil),
		[]byte("*1\r\n$4\r\nPING\r\n"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := Parse(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with length %d", err, n)
			}
		} else {
			if n <= 0 || n > len(b) {
				t.Fatalf("length %d of %d bytes", n, len(b))
			}
			if h.Version == 1 && n > MaxV1 || h.Version == 2 && n > v2Fixed+MaxV2Payload {
				t.Fatalf("version %d header of %d bytes passes the cap", h.Version, n)
			}
			if (h.Source == nil) != (h.Destination == nil) {
				t.Fatalf("one address of two: %v %v", h.Source, h.Destination)
			}
		}
		rh, rest, rerr := Read(iotest.HalfReader(bytes.NewReader(b)))
		switch {
		case err == nil && rerr != nil:
			t.Fatalf("Parse accepted %q, Read refused it: %v", b, rerr)
		case err == nil && (rh.Version != h.Version || addrString(rh.Source) != addrString(h.Source) || !bytes.HasPrefix(b[n:], rest)):
			t.Fatalf("Read and Parse disagree on %q", b)
		case err == ErrIncomplete && !errors.Is(rerr, io.ErrUnexpectedEOF):
			t.Fatalf("incomplete %q: Read says %v", b, rerr)
		case err != nil && err != ErrIncomplete && rerr != err:
			t.Fatalf("%q: Parse says %v, Read %v", b, err, rerr)
		}
	})
}
