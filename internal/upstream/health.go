package upstream

import (
	"errors"
	"net"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
)

// A shared connection whose oldest reply is overdue may be stuck behind a
// slow command (a long script, DEBUG SLEEP, a big SUNIONSTORE), held by
// CLIENT PAUSE, or talking to a Redis that is gone. Closing it fails every
// Call queued on it, which Redis itself would only have delayed, so the
// watchdog first asks Redis on a fresh connection:
//
//   - any reply to a PING (PONG, -BUSY during a script, -LOADING, -NOAUTH)
//     means the server's event loop is running: the connection is kept and
//     its Calls keep waiting, however long the command takes;
//   - a refused or timed-out dial means Redis is gone: the connection is
//     closed at once;
//   - a dial that succeeds but a PING that gets no answer is what a frozen
//     (SIGSTOP) process, DEBUG SLEEP, CLIENT PAUSE ALL and a single slow
//     command look like alike; the connection waits until nothing has been
//     heard from Redis for DeadTimeout, then it is closed.
//
// Closing is what keeps a late reply from reaching the wrong Call: once the
// socket is closed nothing more is read from it.

// probeVerdict is what one probe learned.
type probeVerdict uint8

const (
	probeAlive        probeVerdict = iota // Redis answered
	probeUnresponsive                     // connected, no answer before the deadline
	probeDead                             // could not connect
)

var probePing = []byte("*1\r\n$4\r\nPING\r\n")

// probe dials addr and sends PING without authenticating: an error reply
// (-NOAUTH) proves the server alive just as well, and the probe needs no
// credentials and changes no state. It gives up at deadline or when cancel
// is closed.
func probe(addr string, dialTimeout time.Duration, deadline time.Time, cancel <-chan struct{}) probeVerdict {
	d := net.Dialer{Timeout: dialTimeout, Deadline: deadline}
	nc, err := d.Dial("tcp", addr)
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
	if _, err := nc.Write(probePing); err != nil {
		return probeUnresponsive
	}
	buf := make([]byte, 0, 512)
	tmp := make([]byte, 512)
	for {
		n, err := nc.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if k, serr := resp.ScanReply(buf); serr != nil || k > 0 {
			return probeAlive // anything that looks like a reply at all
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return probeUnresponsive
			}
			// Accepted, then closed without a word: a server that is
			// shutting down or whose listener backlog is all that is left.
			return probeUnresponsive
		}
		if len(buf) > 4096 {
			return probeAlive
		}
	}
}
