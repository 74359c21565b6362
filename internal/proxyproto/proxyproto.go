// Package proxyproto reads the PROXY protocol header (versions 1 and 2,
// as specified by HAProxy) that a load balancer sends first on a
// connection it forwards, to pass on the address of the client it
// accepted.
//
// Only what a TCP proxy needs is decoded: the source and destination of a
// TCP over IPv4 or IPv6 connection, and the TLVs of version 2, uninterpreted.
// A header for anything else (UNKNOWN, LOCAL, UDP, unix sockets) is
// accepted and carries no addresses: the connection's own stand.
package proxyproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
)

// Errors Parse and Read return.
var (
	// ErrIncomplete: the bytes are a prefix of a header; read more.
	ErrIncomplete = errors.New("proxyproto: incomplete header")
	// ErrNoHeader: the bytes do not start with either version's signature.
	ErrNoHeader = errors.New("proxyproto: no PROXY protocol header")
	// ErrInvalid: the signature is there but the header is malformed.
	ErrInvalid = errors.New("proxyproto: invalid PROXY protocol header")
	// ErrTooLong: the header exceeds its version's size limit.
	ErrTooLong = errors.New("proxyproto: PROXY protocol header too long")
)

const (
	// MaxV1 is the longest version 1 header the specification allows,
	// CRLF included.
	MaxV1 = 107
	// MaxV2Payload caps what a version 2 header may carry after its 16
	// fixed bytes (the format allows 65535): addresses and TLVs fit in far
	// less, and the cap bounds what a connection can make us buffer.
	MaxV2Payload = 2048
)

var (
	v1Prefix    = []byte("PROXY ")
	v2Signature = []byte("\r\n\r\n\x00\r\nQUIT\n")
)

// TLV is one type-length-value field of a version 2 header.
type TLV struct {
	Type  byte
	Value []byte
}

// Header is a decoded header.
type Header struct {
	Version int // 1 or 2
	// Source and Destination are the client's address and the address it
	// connected to; both nil when the header carries none (v1 UNKNOWN,
	// v2 LOCAL, or a family other than TCP over IP).
	Source, Destination *net.TCPAddr
	// Local is set for a v2 LOCAL command: the load balancer's own
	// connection (a health check), not a forwarded client.
	Local bool
	TLVs  []TLV
}

// Parse decodes the header at the start of b and returns it with its
// length in bytes. It returns ErrIncomplete while b could still become a
// valid header.
func Parse(b []byte) (Header, int, error) {
	switch {
	case hasPrefix(b, v2Signature):
		return parseV2(b)
	case hasPrefix(b, v1Prefix):
		return parseV1(b)
	}
	return Header{}, 0, ErrNoHeader
}

// hasPrefix reports whether b starts with p, or ErrIncomplete applies (b
// is shorter than p and a prefix of it).
func hasPrefix(b, p []byte) bool {
	n := min(len(b), len(p))
	return bytes.Equal(b[:n], p[:n])
}

func parseV1(b []byte) (Header, int, error) {
	if len(b) < len(v1Prefix) {
		return Header{}, 0, ErrIncomplete
	}
	line := b[:min(len(b), MaxV1)]
	end := bytes.Index(line, []byte("\r\n"))
	if end >= 0 {
		line = line[:end]
	}
	// A bare LF is refused as soon as it is seen, so that a prefix of
	// the input is judged as the whole would be.
	if bytes.IndexByte(line, '\n') >= 0 {
		return Header{}, 0, ErrInvalid
	}
	if end < 0 {
		if len(b) >= MaxV1 {
			return Header{}, 0, ErrTooLong
		}
		return Header{}, 0, ErrIncomplete
	}
	h := Header{Version: 1}
	f := bytes.Split(b[len(v1Prefix):end], []byte(" "))
	switch string(f[0]) {
	case "UNKNOWN":
		// The rest of the line is to be ignored.
		return h, end + 2, nil
	case "TCP4", "TCP6":
	default:
		return Header{}, 0, ErrInvalid
	}
	if len(f) != 5 {
		return Header{}, 0, ErrInvalid
	}
	v4 := f[0][3] == '4'
	src, ok1 := v1Addr(f[1], f[3], v4)
	dst, ok2 := v1Addr(f[2], f[4], v4)
	if !ok1 || !ok2 {
		return Header{}, 0, ErrInvalid
	}
	h.Source, h.Destination = src, dst
	return h, end + 2, nil
}

func v1Addr(ip, port []byte, v4 bool) (*net.TCPAddr, bool) {
	a := net.ParseIP(string(ip))
	if a == nil || (a.To4() != nil) != v4 || !v4 && bytes.IndexByte(ip, '.') >= 0 {
		// TCP6 takes an IPv6 address only, not an IPv4 one in IPv6 form.
		return nil, false
	}
	if len(port) == 0 || len(port) > 5 {
		return nil, false
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return nil, false
		}
	}
	p, err := strconv.Atoi(string(port))
	if err != nil || p > 65535 {
		return nil, false
	}
	if v4 {
		a = a.To4()
	}
	return &net.TCPAddr{IP: a, Port: p}, true
}

const v2Fixed = 16

func parseV2(b []byte) (Header, int, error) {
	if len(b) < v2Fixed {
		return Header{}, 0, ErrIncomplete
	}
	verCmd, fam := b[12], b[13]
	n := int(binary.BigEndian.Uint16(b[14:16]))
	if verCmd>>4 != 2 {
		return Header{}, 0, ErrInvalid
	}
	if n > MaxV2Payload {
		return Header{}, 0, ErrTooLong
	}
	if len(b) < v2Fixed+n {
		return Header{}, 0, ErrIncomplete
	}
	h := Header{Version: 2}
	payload := b[v2Fixed : v2Fixed+n]
	switch verCmd & 0xf {
	case 0:
		h.Local = true
	case 1:
	default:
		return Header{}, 0, ErrInvalid
	}
	var addrLen int
	switch fam >> 4 {
	case 0: // AF_UNSPEC
	case 1: // AF_INET
		addrLen = 12
	case 2: // AF_INET6
		addrLen = 36
	case 3: // AF_UNIX
		addrLen = 216
	default:
		return Header{}, 0, ErrInvalid
	}
	switch fam & 0xf {
	case 0, 1, 2: // UNSPEC, STREAM, DGRAM
	default:
		return Header{}, 0, ErrInvalid
	}
	if h.Local {
		// The addresses and TLVs of a LOCAL header are to be skipped.
		return h, v2Fixed + n, nil
	}
	if len(payload) < addrLen {
		return Header{}, 0, ErrInvalid
	}
	if fam&0xf == 1 && addrLen > 0 && addrLen != 216 {
		ipLen := (addrLen - 4) / 2
		a := payload[:addrLen]
		src, dst := make(net.IP, ipLen), make(net.IP, ipLen)
		copy(src, a[:ipLen])
		copy(dst, a[ipLen:2*ipLen])
		ports := a[2*ipLen:]
		h.Source = &net.TCPAddr{IP: src, Port: int(binary.BigEndian.Uint16(ports[0:2]))}
		h.Destination = &net.TCPAddr{IP: dst, Port: int(binary.BigEndian.Uint16(ports[2:4]))}
	}
	tlvs := payload[addrLen:]
	for len(tlvs) > 0 {
		if len(tlvs) < 3 {
			return Header{}, 0, ErrInvalid
		}
		l := int(binary.BigEndian.Uint16(tlvs[1:3]))
		if len(tlvs) < 3+l {
			return Header{}, 0, ErrInvalid
		}
		h.TLVs = append(h.TLVs, TLV{Type: tlvs[0], Value: bytes.Clone(tlvs[3 : 3+l])})
		tlvs = tlvs[3+l:]
	}
	return h, v2Fixed + n, nil
}

// Read reads a header from r and returns it with the bytes read past it,
// which belong to the stream that follows. It reads at most MaxV1 bytes
// (version 1) or 16 + MaxV2Payload (version 2); the caller bounds the time
// with a deadline.
func Read(r io.Reader) (h Header, rest []byte, err error) {
	buf := make([]byte, 0, 256)
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= v2Fixed+MaxV2Payload {
				return Header{}, nil, ErrTooLong // not reached: Parse caps both versions
			}
			// Only a version 2 header outgrows the first buffer: grow to
			// the largest one allowed.
			grown := make([]byte, len(buf), v2Fixed+MaxV2Payload)
			copy(grown, buf)
			buf = grown
		}
		n, rerr := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		h, used, perr := Parse(buf)
		if perr == nil {
			if used < len(buf) {
				rest = bytes.Clone(buf[used:])
			}
			return h, rest, nil
		}
		if perr != ErrIncomplete {
			return Header{}, nil, perr
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = io.ErrUnexpectedEOF
			}
			return Header{}, nil, rerr
		}
	}
}
