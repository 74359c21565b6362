package proxy

import (
	"bytes"
	"slices"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// A runaway script runs on whichever server its keys led to: any primary
// of a cluster, any upstream of the routes, or, with read_from, a replica
// (EVAL_RO and FCALL_RO are reads). SCRIPT KILL, FUNCTION KILL and
// FUNCTION STATS sent to one server (the startup node, the default
// upstream) answered NOTBUSY from a server that was not running it, and
// the client's one way out through the proxy failed (found by review: a
// cluster node stayed busy until SCRIPT KILL was sent to it directly).
// So they go to every server a client's script can be running on, each
// on a connection of its own, as Redis Cluster's own tips ask of a client
// (request_policy:all_shards; KILL's response_policy:one_succeeded).

// scriptEverywhere reports whether the command named name asks about a
// running script, and so goes to every server a script can run on.
func scriptEverywhere(name string) bool {
	switch name {
	case "script|kill", "function|kill", "function|stats":
		return true
	}
	return false
}

// scriptServers are the pools of every server a script of sess's may be
// running on, with the credential sess's commands use there: the
// upstream's (each routed upstream's, each cluster primary's) first, then
// its replicas.
func (sess *Session) scriptServers() []*upstream.Backend {
	var out []*upstream.Backend
	add := func(b *upstream.Backend) {
		if b != nil && !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	addReplicas := func(rs *replicaSet, primary *upstream.Backend) {
		if rs == nil {
			return
		}
		if k := rs.known.Load(); k != nil {
			for _, n := range *k {
				add(n.backendFor(rs, primary))
			}
		}
	}
	addCluster := func(r *cluster.Router) {
		if m := r.Map(); m != nil {
			for _, p := range m.Primaries() {
				add(r.NodeBackend(p))
			}
		}
	}
	srv := sess.srv
	switch {
	case srv.routes != nil:
		for _, t := range srv.routes.targets {
			if t.router != nil {
				addCluster(t.router)
				continue
			}
			b := t.backend
			if sess.user != nil && sess.user.Upstream.User != "" && t.users[sess.user.Upstream] != nil {
				b = t.users[sess.user.Upstream]
			}
			add(b)
			addReplicas(t.replicas, b)
		}
	case srv.router != nil:
		// Not Server.backend: a node chosen at start, which may have
		// left the cluster since (found by review).
		addCluster(srv.router)
		if cr := srv.creplicas; cr != nil {
			for _, rs := range *cr.sets.Load() {
				addReplicas(rs, rs.primary)
			}
		}
	default:
		add(sess.backend())
		addReplicas(srv.replicas, sess.backend())
	}
	return out
}

// killRank ranks one server's answer to a kill: the lower, the more it
// tells the client.
func killRank(reply []byte) int {
	switch {
	case bytes.Equal(reply, replyOKBytes):
		return 0
	case bytes.HasPrefix(reply, []byte("-NOTBUSY")):
		return 2
	case bytes.HasPrefix(reply, []byte("-ERR redproxy:")):
		// The proxy could not reach the server (errorReply of an
		// upstream error). A busy Redis answers a kill at once, so one
		// that cannot be reached runs no script the kill could stop:
		// another server's NOTBUSY says more (found by review: a dead
		// replica, still listed by its primary, turned NOTBUSY into
		// "upstream unavailable").
		return 3
	}
	return 1 // UNKILLABLE, or another refusal of Redis's
}

var replyOKBytes = []byte("+OK\r\n")

// statsRank ranks one server's answer to FUNCTION STATS the same way.
func statsRank(reply []byte) int {
	switch {
	case resp.FunctionStatsRunning(reply):
		return 0
	case bytes.HasPrefix(reply, []byte("-BUSY")):
		// Redis's answer while an EVAL (not a function) runs there.
		return 1
	case reply[0] != '-':
		return 2
	}
	return 3
}

// runEverywhere sends raw to every server of servers at once, each on a
// connection of its own, and answers as one server would: the answer
// that says most (killRank, statsRank), first server first, and a kill's
// OK or a running script's stats as soon as one server gives it.
func (sess *Session) runEverywhere(name string, raw []byte, backends []*upstream.Backend) []byte {
	resp3 := sess.resp3
	var servers []func(bool, []byte) ([]byte, error)
	for _, b := range backends {
		servers = append(servers, func(resp3 bool, raw []byte) ([]byte, error) { return b.RoundTrip(resp3, true, raw) })
	}
	for _, b := range backends {
		// After a reload moved an address, the old server until it has
		// drained: a script may still run there.
		servers = append(servers, b.DrainingRoundTrips()...)
	}
	rank := killRank
	if name == "function|stats" {
		rank = statsRank
	}
	type answer struct {
		i     int
		reply []byte
	}
	// The goroutines outlive this call (below), so they get a copy of the
	// command: raw is in the client's read buffer, which its next batch,
	// or another client, reuses (found by review: a late server got
	// another client's DEL instead of the kill).
	raw = bytes.Clone(raw)
	// Buffered for every server: once the answer is known the rest finish
	// into it without anyone waiting for them (a frozen server's answer
	// comes only at its reply timeout).
	answers := make(chan answer, len(servers))
	for i, roundTrip := range servers {
		go func() {
			reply, err := roundTrip(resp3, raw)
			if err != nil || len(reply) == 0 {
				reply = errorReply(err)
			}
			answers <- answer{i, reply}
		}()
	}
	// A busy Redis answers these at once (they are allow_busy); one that
	// has not answered within scriptAnswerWait is frozen, gone or far
	// away, and running no script it could stop for us: the client is
	// answered from the others rather than held for a dead_timeout
	// (found by review: 30 s for a NOTBUSY with a frozen replica).
	wait := time.NewTimer(min(scriptAnswerWait, sess.srv.Config().Upstream.ReplyTimeout.Duration))
	defer wait.Stop()
	got := make([][]byte, len(servers))
	for range servers {
		var a answer
		select {
		case a = <-answers:
		case <-wait.C:
			return bestAnswer(got, rank, errScriptNoAnswer)
		}
		if rank(a.reply) == 0 {
			return a.reply
		}
		got[a.i] = a.reply
	}
	return bestAnswer(got, rank, errScriptNoAnswer)
}

// scriptAnswerWait bounds runEverywhere's wait for servers that do not
// answer.
const scriptAnswerWait = time.Second

var errScriptNoAnswer = errorReply(upstream.ErrTimeout)

// bestAnswer is the answer of got ranked lowest, first server first;
// none when no server answered.
func bestAnswer(got [][]byte, rank func([]byte) int, none []byte) []byte {
	var best []byte
	for _, r := range got {
		if r != nil && (best == nil || rank(r) < rank(best)) {
			best = r
		}
	}
	if best == nil {
		return none
	}
	return best
}
