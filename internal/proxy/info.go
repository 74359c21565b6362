package proxy

import (
	"bytes"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/route"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// Version is the proxy's version, as INFO's proxy_version reports it. Set it
// at build time with
//
//	-ldflags "-X github.com/redproxy/redproxy/internal/proxy.Version=1.2.3"
//
// Left empty, the version is the module version the binary was built as,
// or its VCS revision.
var Version = ""

// BuildVersion is the version INFO reports, for --version.
func BuildVersion() string { return buildVersion() }

var buildVersion = sync.OnceValue(func() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "devel-" + s.Value[:12]
		}
	}
	return "devel"
})

// info answers INFO. An operator with redis-cli should see the proxy as
// well as Redis: the proxy's "# Proxy" section is appended to Redis's reply
// when INFO is given no section, "all", "everything", "default" or "proxy"
// among others, and answered alone, without asking Redis, for "INFO proxy".
// Any other section list is Redis's reply unchanged, but in cluster mode,
// where it says standalone (asStandalone). It reports false when the
// command is simply forwarded.
func (sess *Session) info(args [][]byte, raw []byte, m *metrics.Command) bool {
	proxyOnly, withProxy := len(args) > 1, len(args) == 1
	for _, a := range args[1:] {
		switch strings.ToLower(string(a)) {
		case "proxy":
			withProxy = true
		case "all", "everything", "default":
			withProxy, proxyOnly = true, false
		default:
			proxyOnly = false
		}
	}
	switch {
	case proxyOnly:
		b, start := sess.localBuf()
		sess.finishLocal(m, sess.appendInfoReply(b, nil), start)
	case withProxy || sess.srv.router != nil:
		sess.forward(raw, m)
		sl := &sess.slots[len(sess.slots)-1]
		sl.info, sl.infoPx = true, withProxy
	default:
		return false
	}
	return true
}

// withProxyInfo returns Redis's INFO reply, with the proxy's section
// appended when withProxy, and in cluster mode saying standalone. An error
// or an unexpected reply is returned unchanged.
func (sess *Session) withProxyInfo(reply []byte, withProxy bool) []byte {
	body, ok := infoBody(reply)
	if !ok {
		return reply
	}
	if sess.srv.router != nil {
		body = asStandalone(body)
	}
	if !withProxy {
		return sess.appendText(nil, body)
	}
	return sess.appendInfoReply(nil, body)
}

// asStandalone rewrites a cluster node's INFO to say what the proxy is to
// its clients in cluster mode: one ordinary Redis (HELLO answers mode
// standalone, CLUSTER INFO "cluster support disabled"). Forwarded as it
// was, redis_mode:cluster and cluster_enabled:1 made tools that detect a
// cluster from INFO (exporters, GUIs) switch to CLUSTER commands the proxy
// refuses (found by review).
func asStandalone(body []byte) []byte {
	body = bytes.Replace(body, []byte("\r\nredis_mode:cluster\r\n"), []byte("\r\nredis_mode:standalone\r\n"), 1)
	return bytes.Replace(body, []byte("\r\ncluster_enabled:1\r\n"), []byte("\r\ncluster_enabled:0\r\n"), 1)
}

// infoBody returns the text of a bulk (RESP2) or verbatim (RESP3) string.
func infoBody(reply []byte) ([]byte, bool) {
	if len(reply) < 4 || reply[0] != '$' && reply[0] != '=' {
		return nil, false
	}
	nl := bytes.IndexByte(reply, '\n')
	if nl < 2 {
		return nil, false
	}
	n, err := strconv.Atoi(string(reply[1 : nl-1]))
	if err != nil || n < 0 || nl+1+n+2 != len(reply) {
		return nil, false
	}
	body := reply[nl+1 : nl+1+n]
	if reply[0] == '=' {
		if len(body) < 4 || body[3] != ':' {
			return nil, false
		}
		body = body[4:] // the format, "txt:"
	}
	return body, true
}

// appendInfoReply appends redisInfo followed by the proxy's section, as the
// string type INFO has in the session's protocol.
func (sess *Session) appendInfoReply(dst, redisInfo []byte) []byte {
	text := make([]byte, 0, len(redisInfo)+512)
	text = append(text, redisInfo...)
	if len(text) > 0 {
		// Redis separates sections with an empty line.
		if !bytes.HasSuffix(text, []byte("\r\n")) {
			text = append(text, "\r\n"...)
		}
		text = append(text, "\r\n"...)
	}
	return sess.appendText(dst, sess.srv.appendProxySection(text))
}

// appendText appends text as Redis sends its human-readable text replies
// (INFO, CLIENT INFO, CLIENT LIST, ...): a verbatim string ("txt:") in
// RESP3, a bulk string in RESP2.
func (sess *Session) appendText(dst, text []byte) []byte {
	if sess.resp3 {
		dst = append(dst, '=')
		dst = strconv.AppendInt(dst, int64(len(text)+4), 10)
		dst = append(dst, "\r\ntxt:"...)
		dst = append(dst, text...)
		return append(dst, "\r\n"...)
	}
	return redcon.AppendBulk(dst, text)
}

// appendProxySection appends the "# Proxy" section. Its fields are prefixed
// (proxy_..., upstream_..., localtier_..., policy_...) so that tools that
// read INFO as one flat map, ignoring sections, never mistake the proxy's
// connected clients or uptime for Redis's.
func (s *Server) appendProxySection(b []byte) []byte {
	line := func(k, v string) {
		b = append(b, k...)
		b = append(b, ':')
		b = append(b, v...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "# Proxy\r\n"...)
	line("proxy_version", buildVersion())
	line("proxy_uptime_in_seconds", strconv.FormatInt(int64(time.Since(s.started)/time.Second), 10))
	line("proxy_connected_clients", strconv.FormatInt(s.clients.Load(), 10))
	line("proxy_max_clients", strconv.Itoa(s.maxClients())) // reloadable: the snapshot in force, within the file limit

	// One line per upstream node: the server (or Sentinel's primary), each
	// cluster node the proxy has connections for (not the admin backend,
	// which carries no client's command), and with named upstreams each of
	// theirs, its name last.
	for i, u := range s.infoUpstreams() {
		v := "addr=" + u.addr + ",state=" + u.state
		if u.role != "" {
			v += ",role=" + u.role
		}
		if u.b != nil {
			st, up := u.b.AllPoolStats()
			v += ",connections_up=" + strconv.Itoa(up) + ",connections=" + strconv.Itoa(u.b.Connections()) +
				",pinned=" + strconv.FormatInt(u.b.Pinned(), 10) +
				",dials=" + strconv.FormatUint(st.Dials, 10) + // climbs while Redis cannot be reached
				",failures=" + strconv.FormatUint(st.Failures, 10) // connections lost once up
		}
		if u.name != "" {
			v += ",upstream=" + u.name
		}
		line("upstream_"+strconv.Itoa(i), v)
	}
	b0 := s.backend
	line("upstream_redis_version", s.UpstreamVersion())
	pinned := b0.PinnedTotal()
	if s.router != nil {
		// max_pinned bounds each node (PinLimit.Child): the busiest
		// one's count is what compares with it (each node's is on its
		// upstream line), not the sum, which may pass it.
		pinned = b0.Pinned()
		for _, nb := range s.router.Backends() {
			pinned = max(pinned, nb.Backend.Pinned())
		}
	}
	line("pinned_connections", strconv.FormatInt(pinned, 10))
	line("max_pinned_connections", strconv.FormatInt(b0.MaxPinned(), 10))

	if s.tier == nil {
		line("localtier_enabled", "0")
	} else {
		line("localtier_enabled", "1")
		hits, _, _ := metrics.CounterSum(s.metrics.Registry, "redproxy_localcache_hits_total")
		misses, _, _ := metrics.CounterSum(s.metrics.Registry, "redproxy_localcache_misses_total")
		ratio := 0.0
		if hits+misses > 0 {
			ratio = hits / (hits + misses)
		}
		line("localtier_hits", strconv.FormatFloat(hits, 'f', 0, 64))
		line("localtier_misses", strconv.FormatFloat(misses, 'f', 0, 64))
		line("localtier_hit_ratio", strconv.FormatFloat(ratio, 'f', 4, 64))
	}

	// The mode in force: the one the guard has loaded (by the start, a
	// full reload or POST /policy/reload, which replaces no configuration
	// snapshot), capped by --policy-mode.
	line("policy_mode", s.guard.Policy().Mode().String())
	line("policy_forced_mode", s.guard.Report().Policy.ForcedMode)
	// Kept entries, as Redis's SLOWLOG LEN (it showed the entries ever
	// added, 257 with 128 kept, and still 257 after DELETE /debug/slowlog;
	// found by a probe); the count ever added is slowlog_total.
	line("slowlog_entries", strconv.Itoa(s.slow.log.Len()))
	line("slowlog_total", strconv.FormatUint(s.slow.log.Total(), 10))
	return b
}

// infoUpstream is one line of INFO proxy's upstreams.
type infoUpstream struct {
	name, addr, role, state string
	b                       *upstream.Backend
}

// infoUpstreams lists the upstream nodes with their state, probed at once:
// a PING each (Backend.Ready), in parallel, so that one hung node of a
// cluster costs INFO a second, not a second per node.
func (s *Server) infoUpstreams() []infoUpstream {
	var out []infoUpstream
	// admin is the backend of the proxy's own round trips in cluster
	// mode, pointed at a seed while no node is known.
	addCluster := func(name string, r *cluster.Router, admin *upstream.Backend) {
		nodes := r.Backends()
		m := r.Map()
		for _, n := range nodes {
			role, state := "replica", ""
			if n.Primary {
				role = "primary"
				if m != nil && m.Failed(n.Addr) {
					// The cluster's word, not probed: a PING to a hung
					// node would cost INFO its timeout.
					state = "failed"
				}
			}
			out = append(out, infoUpstream{name: name, addr: n.Addr, role: role, state: state, b: n.Backend})
			if n.Primary && s.creplicas != nil && r == s.router {
				if sets := s.creplicas.sets.Load(); sets != nil {
					out = appendReplicaLines(out, name, (*sets)[n.Addr])
				}
			}
		}
		if len(nodes) > 0 {
			return
		}
		// No slot map yet (the cluster down since the start): its seeds,
		// down, so that the upstream has a line and says so.
		for _, seed := range r.Seeds() {
			u := infoUpstream{name: name, addr: seed, role: "seed", state: "down"}
			if admin != nil && admin.Addr() == seed {
				u.b, u.state = admin, ""
			}
			out = append(out, u)
		}
	}
	switch {
	case s.routes != nil:
		for i, t := range s.routes.targets {
			switch {
			case i == route.Default && s.router != nil:
				addCluster(t.name, s.router, s.backend)
			case t.router != nil:
				addCluster(t.name, t.router, nil)
			case t.backend != nil:
				out = append(out, infoUpstream{name: t.name, addr: t.backend.Addr(), b: t.backend})
				out = appendReplicaLines(out, t.name, t.replicas)
			}
		}
	case s.router != nil:
		addCluster("", s.router, s.backend)
	default:
		out = append(out, infoUpstream{addr: s.backend.Addr(), b: s.backend})
		if s.replicas != nil {
			out[0].role = "primary"
			out = appendReplicaLines(out, "", s.replicas)
		}
	}
	var wg sync.WaitGroup
	for i := range out {
		if out[i].state != "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].state = "down"
			if out[i].b.Ready() {
				out[i].state = "up"
			}
		}()
	}
	wg.Wait()
	return out
}

// appendReplicaLines adds the replicas rs reads from (read_from), each with
// the state its last poll found, not probed: up (reads may go there),
// lagging (answering but behind max_replica_lag, or failed a read since the
// poll) or down (the last poll did not reach it).
func appendReplicaLines(out []infoUpstream, name string, rs *replicaSet) []infoUpstream {
	if rs == nil {
		return out
	}
	known := rs.known.Load()
	if known == nil {
		return out
	}
	v := rs.view.Load()
	now := time.Now()
	for _, n := range *known {
		state := "down"
		if v != nil {
			for i := range v.nodes {
				if v.nodes[i].node == n {
					state = "lagging"
					if rs.fresh(v, &v.nodes[i], now) {
						state = "up"
					}
					break
				}
			}
		}
		out = append(out, infoUpstream{name: name, addr: n.addr, role: "replica", state: state, b: n.backend})
	}
	return out
}
