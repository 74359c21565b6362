package proxy

import (
	"errors"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/upstream"
)

// While a script or function runs past busy-reply-threshold, Redis answers
// every other command with -BUSY, except those flagged allow_busy: SCRIPT
// KILL, FUNCTION KILL, FUNCTION STATS and SHUTDOWN (the rest of that set,
// AUTH, HELLO, MULTI, ..., are connection state the proxy handles itself).
// They are how a runaway script is stopped, so they must reach Redis at
// once. On a shared connection they could sit behind the very script they
// are meant to kill (its caller's connection is not read until it ends), so
// each runs on a connection of its own: one kept per backend and protocol
// for the next such command (upstream's aloneConns), others dialled when
// several run at once and closed after.
// These connections are not counted in upstream.max_pinned: an emergency
// command must not be refused because every dedicated connection is busy;
// a client runs one at a time, so max_clients bounds them.

// runsAlone reports whether cmd is sent on a connection of its own.
func runsAlone(cmd *commands.Command) bool {
	return cmd.Flags&commands.AllowBusy != 0 && cmd.Flags&commands.ConnState == 0
}

// runAlone answers cmd from a connection of its own, after everything the
// client sent before it has been answered.
func (sess *Session) runAlone(r *request) {
	cmd, m := r.cmd, r.m
	sess.flush(time.Now())
	if scriptEverywhere(cmd.Name) {
		servers := sess.scriptServers()
		if len(servers) > 1 || len(servers) == 1 && len(servers[0].DrainingRoundTrips()) > 0 {
			sess.replyLocal(m, sess.runEverywhere(cmd.Name, r.Raw, servers))
			return
		}
	}
	// SHUTDOWN's success is its connection closing: never a kept one.
	reply, err := sess.backend().RoundTrip(sess.resp3, cmd.Name != "shutdown", r.Raw)
	switch {
	case err == nil:
		sess.replyLocal(m, reply)
	case errors.Is(err, upstream.ErrNoReply) && cmd.Name == "shutdown":
		// Redis closes its clients' connections when it shuts down, and
		// client libraries take that as SHUTDOWN's success: do the same.
		sess.closing(metrics.CloseUpstreamLost)
		sess.quitting = true
	default:
		sess.replyLocal(m, errorReply(err))
	}
}
