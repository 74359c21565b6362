package upstream

import (
	"bytes"
	"errors"
	"net"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
)

// A shared connection whose oldest reply is overdue may be stuck behind a
// slow command (a long script, DEBUG SLEEP, a big SUNIONSTORE), held by
// CLIENT PAUSE, cut off by the network, or talking to a Redis that is gone.
// Closing it fails every Call queued on it, which Redis itself would only
// have delayed, so the watchdog first asks Redis on a fresh connection:
//
//   - -BUSY: a script or function is running, and Redis reads no more of
//     the connection that called it until it ends. That is a reason for
//     the reply to be late, so the Calls keep waiting, however long the
//     script takes (SCRIPT KILL, FUNCTION KILL and SHUTDOWN NOSAVE end it).
//   - a refused or timed-out dial: Redis is gone; the connection is closed
//     at once.
//   - any other reply (PONG, -LOADING, -NOAUTH) or no reply at all: Redis
//     is paused (CLIENT PAUSE WRITE answers PING, CLIENT PAUSE ALL does
//     not), blocked in one long command (DEBUG SLEEP), frozen (SIGSTOP), or
//     answering others while this connection is cut off. These cannot be
//     told apart from outside, so the connection waits until the oldest
//     reply is DeadTimeout old, then it is closed. A busy verdict counts as
//     hearing from Redis, so the wait restarts after the script ends.
//
// Closing is what keeps a late reply from reaching the wrong Call: once the
// socket is closed nothing more is read from it.

// probeVerdict is what one probe learned.
type probeVerdict uint8

const (
	probeBusy         probeVerdict = iota // -BUSY: a script or function is running
	probeAnswered                         // some other reply
	probeUnresponsive                     // connected, no answer before the deadline
	probeDead                             // could not connect
)

// probe dials Redis and sends PING, after AUTH when a password is set:
// Redis refuses an unauthenticated command (-NOAUTH) before it looks for a
// running script, and AUTH itself is allowed while one runs. It gives up at
// deadline or when cancel is closed.
func probe(opt Options, deadline time.Time, cancel <-chan struct{}) probeVerdict {
	d := net.Dialer{Timeout: opt.DialTimeout, Deadline: deadline}
	nc, err := DialConn(&d, opt.Addr, opt.TLS)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(deadline) {
			// Ran out of overall time rather than being refused.
			return probeUnresponsive
		}
		return probeDead
	}
	defer nc.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-cancel:
			nc.Close()
		case <-stop:
		}
	}()
	nc.SetDeadline(deadline)
	var req []byte
	skip := 0
	if opt.Password != "" {
		if opt.Username != "" {
			req = resp.AppendCommandStrings(req, "AUTH", opt.Username, opt.Password)
		} else {
			req = resp.AppendCommandStrings(req, "AUTH", opt.Password)
		}
		skip = 1
	}
	req = append(req, resp.Ping...)
	if _, err := nc.Write(req); err != nil {
		return probeUnresponsive
	}
	var reply, buf []byte
	for ; skip >= 0; skip-- {
		if reply, buf, err = readReply(nc, buf, 4096); err != nil {
			if errors.Is(err, resp.ErrProtocol) {
				return probeAnswered // not RESP, but something answered
			}
			// A deadline, or accepted then closed without a word (a server
			// shutting down, or only a listen backlog left): no answer.
			return probeUnresponsive
		}
	}
	if bytes.HasPrefix(reply, busyPrefix) {
		return probeBusy
	}
	return probeAnswered
}
