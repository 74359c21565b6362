package upstream

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
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
	replies, err := roundTripAll(opt, raw)
	return lastReply(replies), err
}

// roundTripAll is RoundTrip for raw holding one or more commands: it
// returns every reply, in order.
func roundTripAll(opt Options, raw []byte) ([][]byte, error) {
	opt.defaults()
	nc, err := Dial(opt)
	if err != nil {
		return nil, aloneError(err, false)
	}
	defer nc.Close()
	defer closeOnCancel(nc, opt.cancel)()
	replies, _, err := exchange(opt, nc, raw)
	return replies, aloneError(err, true)
}

// aloneOptions is opt for a command a client sent alone (SCRIPT KILL,
// FUNCTION KILL/STATS, CLIENT UNBLOCK, SHUTDOWN), whose handshake may wait
// as long as its command (DeadTimeout) once connected, until stop: a
// script keeps Redis from reading anything until busy-reply-threshold, and
// a SCRIPT KILL sent before then, which Redis answers once the threshold
// passes, failed "upstream unavailable" at the dial timeout with the
// script left running (found by a probe: sent 1 s into a 12 s script,
// with Redis's threshold at 5 s). The proxy's own probes (RoundTrip:
// Sentinel's role check, the cluster's slot map) keep the dial timeout.
func aloneOptions(opt Options, stop <-chan struct{}) Options {
	opt = patientHandshake(opt)
	opt.cancel = stop
	return opt
}

// patientHandshake is opt with a handshake that, once connected, waits
// for Redis as long as a command's reply may take (DeadTimeout): Redis
// paused (CLIENT PAUSE, DEBUG SLEEP, a script, a stopped process) reads
// nothing until it resumes, and a client's dedicated connection (WATCH,
// MULTI, BLPOP, SUBSCRIBE) dialled meanwhile failed "upstream
// unavailable" at the dial timeout where Redis directly answers once the
// pause ends (found by a probe: 2 s into a 5 s pause). Reaching Redis
// keeps the dial timeout.
func patientHandshake(opt Options) Options {
	opt.defaults()
	opt.handshakeTimeout = opt.DeadTimeout
	return opt
}

// lastReply is the last of replies, nil if there is none.
func lastReply(replies [][]byte) []byte {
	if len(replies) == 0 {
		return nil
	}
	return replies[len(replies)-1]
}

// aloneError is what the caller, and so a client, is told of err from a
// connection of its own: the proxy's words for an upstream that cannot be
// reached, does not answer or dropped the connection
// (ErrUnavailable, ErrTimeout, ErrConnLost), not Go's ("read tcp
// 127.0.0.1:53782->127.0.0.1:6379: i/o timeout" answered a CLIENT UNBLOCK,
// found by review). Redis's refusal of the handshake and ErrNoReply are
// kept: they say more. connected: err came after the dial.
func aloneError(err error, connected bool) error {
	if err == nil || errors.Is(err, ErrHandshake) || errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrNoReply) {
		return err
	}
	var ne net.Error
	isNet := errors.As(err, &ne) || PeerClosed(err)
	switch {
	case !isNet:
		return err
	case !connected:
		return ErrUnavailable
	case ne != nil && ne.Timeout():
		return ErrTimeout
	}
	return ErrConnLost
}

// exchange sends raw, one or more commands, on nc and reads their replies,
// within opt.DeadTimeout. clean is false when the connection must not
// carry another command.
func exchange(opt Options, nc net.Conn, raw []byte) (replies [][]byte, clean bool, err error) {
	nc.SetDeadline(time.Now().Add(opt.DeadTimeout))
	if _, err := nc.Write(raw); err != nil {
		return nil, false, err
	}
	var rest []byte
	for range commandCount(raw) {
		var reply []byte
		reply, rest, err = readReply(nc, rest, maxAloneReply)
		if err != nil {
			if errors.Is(err, io.EOF) && len(rest) == 0 {
				return replies, false, ErrNoReply
			}
			return replies, false, err
		}
		replies = append(replies, reply)
	}
	return replies, len(rest) == 0, nil
}

// commandCount is the number of commands in raw (at least 1).
func commandCount(raw []byte) int {
	n := 0
	for len(raw) > 0 {
		size, err := resp.ScanReply(raw)
		if err != nil || size == 0 {
			break
		}
		raw = raw[size:]
		n++
	}
	return max(n, 1)
}

// aloneConns keeps one connection of roundTrip's per protocol for the
// next command sent alone. Dialling one per command let one client that
// pipelined FUNCTION STATS dial Redis about 2,600 times a second (found by
// review), each dial leaving a socket in TIME_WAIT: across hosts, enough to
// run out of ephemeral ports towards Redis and fail every other dial. Kept
// is one connection: commands sent alone by several clients at once dial
// the others, as before.
type aloneConns struct {
	kept [2]atomic.Pointer[aloneConn]
	// stop is closed by close: a connection being dialled or used that is
	// not kept yet is closed then, so its command ends, and none is kept
	// after. Its handshake may
	// wait for a busy Redis up to DeadTimeout (aloneOptions), and a
	// shutdown waited that long for a SCRIPT KILL sent to a frozen Redis
	// (found by review).
	stop     chan struct{}
	stopOnce sync.Once
}

func newAloneConns() *aloneConns { return &aloneConns{stop: make(chan struct{})} }

type aloneConn struct{ nc net.Conn }

// roundTrip is RoundTrip on a kept connection when there is one. A
// command that must see its connection closed (SHUTDOWN) passes keep
// false and gets a connection of its own, closed after.
// It returns the reply of every command in raw.
func (a *aloneConns) roundTrip(opt Options, resp3, keep bool, raw []byte) ([][]byte, error) {
	opt = aloneOptions(opt, a.stop)
	if !keep {
		return roundTripAll(opt, raw)
	}
	replies, connected, err := a.keptRoundTrip(opt, resp3, raw)
	return replies, aloneError(err, connected)
}

// keptRoundTrip is roundTrip with keep; connected: err came after a dial.
func (a *aloneConns) keptRoundTrip(opt Options, resp3 bool, raw []byte) (replies [][]byte, connected bool, err error) {
	i := 0
	if resp3 {
		i = 1
	}
	if c := a.kept[i].Swap(nil); c != nil {
		unwatch := closeOnCancel(c.nc, opt.cancel)
		replies, clean, err := exchange(opt, c.nc, raw)
		unwatch()
		if clean {
			a.keep(i, c)
			return replies, true, err
		}
		c.nc.Close()
		if !closedIdle(err) || len(replies) > 0 {
			return replies, true, err
		}
		// Closed while it was kept (Redis's timeout, CLIENT KILL, a
		// restart): the command did not reach Redis; send it on a new one.
	}
	nc, err := Dial(opt)
	if err != nil {
		return nil, false, err
	}
	unwatch := closeOnCancel(nc, opt.cancel)
	replies, clean, err := exchange(opt, nc, raw)
	unwatch()
	if clean {
		a.keep(i, &aloneConn{nc: nc})
	} else {
		nc.Close()
	}
	return replies, true, err
}

// closedIdle reports whether err says a kept connection had been closed
// by the other side before the command was sent: a reset, a broken pipe
// or no reply at all. A timeout is not one (Redis may be slow), nor a
// reply too long (the command ran).
func closedIdle(err error) bool {
	return errors.Is(err, ErrNoReply) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (a *aloneConns) keep(i int, c *aloneConn) {
	if !a.kept[i].CompareAndSwap(nil, c) {
		c.nc.Close()
		return
	}
	if isClosed(a.stop) {
		a.close() // close raced with the store
	}
}

// closeOnCancel closes nc when cancel (nil: never) is closed, until the
// function it returns is called.
func closeOnCancel(nc net.Conn, cancel <-chan struct{}) (unwatch func()) {
	if cancel == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-cancel:
			nc.Close()
		case <-done:
		}
	}()
	return func() { close(done) }
}

func (a *aloneConns) close() {
	a.stopOnce.Do(func() { close(a.stop) })
	for i := range a.kept {
		if c := a.kept[i].Swap(nil); c != nil {
			c.nc.Close()
		}
	}
}
