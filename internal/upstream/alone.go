package upstream

import (
	"errors"
	"io"
	"time"
)

// ErrNoReply: Redis closed the connection without answering (as it does
// when SHUTDOWN succeeds).
var ErrNoReply = errors.New("redproxy: upstream closed the connection without a reply")

// maxAloneReply caps the reply RoundTrip reads; the commands sent this way
// (SCRIPT KILL, FUNCTION STATS, SHUTDOWN) answer in a few hundred bytes.
const maxAloneReply = 1 << 20

// RoundTrip sends one raw command on a new connection of its own and
// returns its reply, waiting at most opt.DeadTimeout. It is for the
// commands Redis runs while a script keeps it busy: on a connection of its
// own, such a command reaches Redis at once, whatever the shared
// connections are waiting for. The connection's handshake (AUTH or HELLO,
// SELECT when opt.DB is not 0) runs first; CLIENT SETNAME may be refused.
func RoundTrip(opt Options, raw []byte) ([]byte, error) {
	opt.defaults()
	nc, err := Dial(opt)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(opt.DeadTimeout))
	if _, err := nc.Write(raw); err != nil {
		return nil, err
	}
	reply, rest, err := readReply(nc, nil, maxAloneReply)
	if errors.Is(err, io.EOF) && len(rest) == 0 {
		return nil, ErrNoReply
	}
	return reply, err
}
