package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/localcache"
)

// The command table follows the upstream. It is read from Redis at start
// (cmd/redproxy); when the main pools' dials report another server than
// the one it was read from (a reload of upstream.address, a Sentinel
// failover, a Redis upgraded in place: another address or another
// version), it is read again from that server in the background and
// swapped in as a whole, so commands the new server has and the old one
// lacked are classified (keys, flags, arity), and those it lacks are no
// longer taken for known. Until the new table is in, the old one
// classifies; if it cannot be read, the old one stays and the failure is
// logged once per server. A failure that may pass (a timeout, BUSY,
// LOADING: TableErrorPasses) is asked again on a timer, from 0.5 s
// doubling up to tableRetryEvery, while that server is the upstream; any
// other (COMMAND refused) on a later dial at most every tableRetryEvery.
//
// A table that stood in for the upstream's at start (the built-in one,
// Options.TableStandIn) describes no server: the first dial that reaches
// one has that server's table read.
//
// In cluster mode the server followed is the node the proxy's own backend
// was pointed at when it started (Router.AnyNode), and the routers (the
// cluster's, a named cluster upstream's, a mirror's) plan with the set in
// force (cluster.Options.Tables, tableInForce). It stayed the one read at
// start, so a proxy started while the cluster was down kept the built-in
// table for good (found by review). Named upstreams are classified with
// [upstream]'s table.

// commandSet is a command table and what the proxy derived from it, an
// immutable snapshot swapped as a whole (Server.cmds). A session takes the
// set in force at the start of each batch it reads (Session.cmds) and
// looks every command of that batch up in it, so a command and its
// handler entry always come from the same table.
type commandSet struct {
	table    *commands.Table
	handlers map[*commands.Command]*cmdEntry // what the proxy does itself, per command (dispatch.go)
	// cacheable holds localcache.CacheableCommand for every command of
	// the table, so the local tier's hot path does a pointer lookup
	// instead of a name lookup (tier.go).
	cacheable map[*commands.Command]bool
	// from is the address of the upstream the table describes, and
	// version that server's version as its dials reported it ("" until
	// one did).
	from, version string
}

func newCommandSet(t *commands.Table, from, version string) *commandSet {
	cs := &commandSet{table: t, handlers: newHandlers(t), cacheable: map[*commands.Command]bool{}, from: from, version: version}
	for _, cmd := range t.Commands() {
		if localcache.CacheableCommand(cmd) {
			cs.cacheable[cmd] = true
		}
		for _, sub := range cmd.Subcommands {
			if localcache.CacheableCommand(sub) {
				cs.cacheable[sub] = true
			}
		}
	}
	return cs
}

// tableRetryEvery bounds how often a table that could not be read is asked
// for again (on a later dial of the same server).
const tableRetryEvery = 10 * time.Second

// tableFollow is the state of the table's reads from the upstream, under
// mu.
type tableFollow struct {
	mu sync.Mutex
	// off: the server shut down; the table no longer follows.
	off bool
	// reading is the server a read runs for ("" when none does); want the
	// one the last dial reported, read next if it differs.
	reading, want tableSource
	// failed is the last server a read failed for, and when.
	failed   tableSource
	failedAt time.Time
	stop     context.CancelFunc // cancels a read running; set with ctx
	ctx      context.Context
	wg       sync.WaitGroup
}

type tableSource struct{ addr, version string }

// cmdSet returns the command set in force.
func (s *Server) cmdSet() *commandSet { return s.cmds.Load() }

// tableInForce is the table of the set in force, for the cluster routers
// (cluster.Options.Tables): asked at each command, so a router never keeps
// a table the sessions no longer classify with, however its start and a
// table read interleave.
func (s *Server) tableInForce() *commands.Table { return s.cmds.Load().table }

// initCommands sets the table the server starts with, read from (or
// standing in for) the upstream at addr.
func (s *Server) initCommands(t *commands.Table, addr string) {
	s.cmds.Store(newCommandSet(t, addr, ""))
	s.waitShardedMark.Store(t.Get("spublish") != nil)
	s.tables.ctx, s.tables.stop = context.WithCancel(context.Background())
}

// upstreamSeen is told the version a dial of the main pools' upstream at
// addr reported (mainBackendOptions): when that is not the server the
// table describes, the table is read again from it, in the background.
func (s *Server) upstreamSeen(addr, version string) {
	if cur := s.cmdSet(); cur.from == addr && cur.version == version {
		return // the common case: another dial of the same server
	}
	f := &s.tables
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return
	}
	cur := s.cmdSet()
	if cur.from == addr && cur.version == "" {
		// The first version heard of the server the table was read
		// from (at start): the table is that server's.
		next := *cur
		next.version = version
		s.cmds.Store(&next)
		return
	}
	if cur.from == addr && cur.version == version {
		return
	}
	src := tableSource{addr, version}
	f.want = src
	if f.reading != (tableSource{}) {
		return // read next, once the running read ends (readTable)
	}
	if f.failed == src && time.Since(f.failedAt) < tableRetryEvery {
		return
	}
	f.reading = src
	f.wg.Add(1)
	go s.readTable(src)
}

// readTable reads the command table of the upstream src and swaps it in,
// if src is still the upstream then; it then reads the one a dial asked
// for meanwhile, if any.
func (s *Server) readTable(src tableSource) {
	f := &s.tables
	defer f.wg.Done()
	wait := tableRetry
	for {
		t, err := s.loadTable(f.ctx, src.addr)
		f.mu.Lock()
		current := false
		if cur := s.versionFrom.Load(); cur != nil && *cur == src.addr {
			current = true
		}
		retry := false
		switch {
		case f.off:
		case err != nil:
			if f.failed != src {
				s.log.Warn("cannot read the upstream's command table; the one in force stays", "upstream", src.addr, "version", src.version, "err", err)
			} else {
				s.log.Debug("cannot read the upstream's command table yet", "upstream", src.addr, "err", err)
			}
			f.failed, f.failedAt = src, time.Now()
			// A failure that may pass (Redis busy with a script, loading)
			// is asked again on a timer: the pools' connections, once up,
			// dial no more, and the table waited for a dial that never
			// came (found by review: a proxy started beside a Redis busy
			// with a script kept the built-in table for good).
			retry = current && TableErrorPasses(err) && (f.want == src || f.want == tableSource{})
		case current:
			old := s.cmdSet()
			s.cmds.Store(newCommandSet(t, src.addr, src.version))
			s.waitShardedMark.Store(t.Get("spublish") != nil)
			s.log.Info("command table read from the upstream", "upstream", src.addr, "version", src.version,
				"commands", t.Len(), "previous_commands", old.table.Len())
		}
		if retry {
			f.mu.Unlock() // f.reading stays src: a dial meanwhile only sets f.want
			select {
			case <-f.ctx.Done():
				f.mu.Lock()
				f.reading = tableSource{}
				f.mu.Unlock()
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, tableRetryEvery)
			f.mu.Lock()
			if next := f.want; next != src && next != (tableSource{}) {
				src, wait = next, tableRetry // another server was dialled meanwhile
				f.reading = src
			}
			f.mu.Unlock()
			continue
		}
		f.reading = tableSource{}
		next := f.want
		cur := s.cmdSet()
		if f.off || next == src || next == (tableSource{}) || cur.from == next.addr && cur.version == next.version ||
			f.failed == next && time.Since(f.failedAt) < tableRetryEvery {
			f.mu.Unlock()
			return
		}
		f.reading, src, wait = next, next, tableRetry
		f.mu.Unlock()
	}
}

// TableErrorPasses reports whether a failure to read the command table
// may pass: no answer (down, a timeout) or a state Redis leaves by itself
// (BUSY with a script, LOADING its dataset, MASTERDOWN, TRYAGAIN,
// CLUSTERDOWN). The table is then asked for again. Any other refusal (an
// ACL without COMMAND, COMMAND renamed away, a reply that is not a table)
// would answer the same again.
func TableErrorPasses(err error) bool {
	if err == nil || errors.Is(err, commands.ErrBadReply) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	msg := reply.Error()
	for _, p := range []string{"BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// tableRetry is how long readTable waits before asking again after a
// failure that may pass, doubled up to tableRetryEvery.
const tableRetry = 500 * time.Millisecond

// loadTable asks the Redis at addr for its command table, with the
// upstream's credentials and TLS, as the start does (cmd/redproxy).
func (s *Server) loadTable(ctx context.Context, addr string) (*commands.Table, error) {
	cfg := s.Config()
	c := ControlClient(cfg, addr, s.tls.upstream.Load())
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*cfg.Upstream.DialTimeout.Duration+ControlReplyTimeout)
	defer cancel()
	return commands.Load(ctx, c)
}

// ControlReplyTimeout bounds the wait for a reply to a ControlClient's
// commands (COMMAND, INFO).
const ControlReplyTimeout = 3 * time.Second

// ControlClient is a go-redis client of the upstream at addr, with its
// credentials and tlsConf, for the one-off questions the proxy asks
// outside its own connections: the command table and version at start
// (cmd/redproxy) and the table of a new upstream (loadTable).
func ControlClient(cfg *config.Config, addr string, tlsConf *tls.Config) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Username: cfg.Upstream.Username, Password: cfg.Upstream.Password,
		TLSConfig:   tlsConf,
		DialTimeout: cfg.Upstream.DialTimeout.Duration, MaxRetries: -1, PoolSize: 1,
		// One dial: go-redis's default of five, with its pool's back-off,
		// held the listener back by about 4 s at start when Redis was not
		// up yet (a container started before Redis); the proxy's own
		// connections keep redialing after it listens.
		DialerRetries: 1,
		// go-redis's default, written out: how long a Redis that accepted
		// and stays silent holds the listener back (COMMAND), and how long
		// a slow one has to send COMMAND's 200 KB before the built-in
		// table is used instead.
		ReadTimeout: ControlReplyTimeout,
		Protocol:    2, DisableIdentity: true,
	})
}

// stopTables ends the table's reads: one running is cancelled and waited
// for, and none starts after.
func (s *Server) stopTables() {
	f := &s.tables
	f.mu.Lock()
	f.off = true
	f.mu.Unlock()
	if f.stop != nil {
		f.stop()
	}
	f.wg.Wait()
}
