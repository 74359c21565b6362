package faultsuite

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
)

// hangTimeout is how long a client waits for a reply before it counts a
// hang: far longer than any fault the suite injects lasts.
const hangTimeout = 10 * time.Second

// maxBulk caps what the test client accepts in one reply; the suite's
// values are tiny, so anything large is a framing error.
const maxBulk = 1 << 20

// value is one RESP2 or RESP3 reply.
type value struct {
	kind  byte // the RESP type byte: + - : $ * _ % > ~ , # ( = !
	str   string
	num   int64
	null  bool
	elems []value // arrays, sets, pushes; maps flattened key, value, ...
}

func (v value) isErr() bool  { return v.kind == '-' || v.kind == '!' }
func (v value) isNull() bool { return v.null || v.kind == '_' }

// isArray reports whether v is a non-null aggregate of sequence kind.
func (v value) isArray() bool {
	return !v.isNull() && (v.kind == '*' || v.kind == '>' || v.kind == '~')
}

// isBulk reports whether v is a non-null bulk string equal to s.
func (v value) isBulk(s string) bool {
	return !v.isNull() && (v.kind == '$' || v.kind == '+') && v.str == s
}

func (v value) String() string {
	var b strings.Builder
	v.render(&b)
	s := b.String()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func (v value) render(b *strings.Builder) {
	switch {
	case v.kind == '_' || v.null:
		b.WriteString("(nil" + string(v.kind) + ")")
	case v.kind == ':':
		fmt.Fprintf(b, ":%d", v.num)
	case v.kind == '+' || v.kind == '-' || v.kind == '!' || v.kind == ',' || v.kind == '#' || v.kind == '(':
		b.WriteString(string(v.kind) + v.str)
	case v.kind == '$' || v.kind == '=':
		b.WriteString(strconv.Quote(v.str))
	default:
		b.WriteByte(v.kind)
		b.WriteByte('[')
		for i, e := range v.elems {
			if i > 0 {
				b.WriteByte(' ')
			}
			e.render(b)
		}
		b.WriteByte(']')
	}
}

// strings returns every string inside v, for the cross-talk scan.
func (v value) strings(dst []string) []string {
	if v.str != "" {
		dst = append(dst, v.str)
	}
	for _, e := range v.elems {
		dst = e.strings(dst)
	}
	return dst
}

var errFraming = errors.New("faultsuite: malformed reply")

func readValue(br *bufio.Reader) (value, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return value{}, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return value{}, fmt.Errorf("%w: line %q", errFraming, line)
	}
	kind, body := line[0], line[1:len(line)-2]
	v := value{kind: kind}
	switch kind {
	case '+', '-', ',', '#', '(':
		v.str = body
	case '_':
		v.null = true
	case ':':
		if v.num, err = strconv.ParseInt(body, 10, 64); err != nil {
			return value{}, fmt.Errorf("%w: integer %q", errFraming, body)
		}
	case '$', '=', '!':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxBulk {
			return value{}, fmt.Errorf("%w: bulk length %q", errFraming, body)
		}
		if n < 0 {
			v.null = true
			return v, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return value{}, err
		}
		v.str = string(buf[:n])
		if kind == '=' && len(v.str) >= 4 {
			v.str = v.str[4:] // drop the verbatim string's "txt:"
		}
	case '*', '>', '~', '%', '|':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxBulk {
			return value{}, fmt.Errorf("%w: aggregate length %q", errFraming, body)
		}
		if n < 0 {
			v.null = true
			return v, nil
		}
		if kind == '%' || kind == '|' {
			n *= 2
		}
		for range n {
			e, err := readValue(br)
			if err != nil {
				return value{}, err
			}
			v.elems = append(v.elems, e)
		}
		if kind == '|' { // attributes precede the reply they describe
			return readValue(br)
		}
	default:
		return value{}, fmt.Errorf("%w: type byte %q", errFraming, kind)
	}
	return v, nil
}

// client is one raw RESP connection to the proxy. Raw sockets rather than
// a client library, so that nothing retries, reconnects or re-orders
// behind the test's back.
type client struct {
	nc    net.Conn
	br    *bufio.Reader
	resp3 bool
}

// dial connects to addr and, for RESP3, switches protocol with HELLO 3.
func dial(addr string, resp3 bool) (*client, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	c := &client{nc: nc, br: bufio.NewReader(nc), resp3: resp3}
	if resp3 {
		if err := c.send([]string{"HELLO", "3"}); err != nil {
			c.close()
			return nil, err
		}
		v, err := c.read()
		if err != nil {
			c.close()
			return nil, err
		}
		if v.kind != '%' {
			c.close()
			return nil, fmt.Errorf("HELLO 3 answered %s", v)
		}
	}
	return c, nil
}

// send writes cmds in one write, as a pipelining client does.
func (c *client) send(cmds ...[]string) error {
	var b []byte
	for _, cmd := range cmds {
		b = resp.AppendCommandStrings(b, cmd...)
	}
	c.nc.SetWriteDeadline(time.Now().Add(hangTimeout))
	_, err := c.nc.Write(b)
	return err
}

// read returns the next reply, waiting at most hangTimeout.
func (c *client) read() (value, error) {
	c.nc.SetReadDeadline(time.Now().Add(hangTimeout))
	return readValue(c.br)
}

// readTwo returns the replies to two pipelined commands.
func (c *client) readTwo() (first, second value, err error) {
	if first, err = c.read(); err == nil {
		second, err = c.read()
	}
	return first, second, err
}

// readNoDeadline is for a reader goroutine whose owner closes the
// connection to stop it.
func (c *client) readNoDeadline() (value, error) {
	c.nc.SetReadDeadline(time.Time{})
	return readValue(c.br)
}

func (c *client) close() { c.nc.Close() }

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
