package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"

	"github.com/redproxy/redproxy/internal/commands"
)

// embeddedStore is the in-process demo store and what keeps its clock.
type embeddedStore struct {
	*miniredis.Miniredis
	stop, done chan struct{}
}

// Close stops the store's clock, then the store.
func (e *embeddedStore) Close() {
	close(e.stop)
	<-e.done
	e.Miniredis.Close()
}

// Expiry sweeps: at least this far apart, and at most expiryShare of the
// time (embeddedExpiry).
const (
	expiryEvery = 100 * time.Millisecond
	expiryShare = 20 // a sweep's length times this: the next one's distance at least
)

// embeddedExpiry tells the store how much time has passed, until stop:
// miniredis ages TTLs only when told (FastForward), so a key set with
// EX 1 was still there ten minutes later; the seed patterns' locks, rate
// limits and cache entries never expired and memory only grew (found by a
// probe: 1M keys with EX 5 all still there, 900 MB). A sweep walks and
// sorts every key under the store's lock, so sweeps are spaced to take at
// most 1/expiryShare of the time: every 100 ms for small stores, less
// often (and TTLs that much coarser) for millions of keys.
func embeddedExpiry(mr *miniredis.Miniredis, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	last := time.Now()
	wait := expiryEvery
	for {
		select {
		case <-stop:
			return
		case <-time.After(wait):
		}
		now := time.Now()
		mr.FastForward(now.Sub(last))
		last = now
		wait = max(expiryEvery, expiryShare*time.Since(now))
	}
}

// startEmbedded runs the in-process demo store on a loopback port.
func startEmbedded() (*embeddedStore, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, err
	}
	e := &embeddedStore{Miniredis: mr, stop: make(chan struct{}), done: make(chan struct{})}
	go embeddedExpiry(mr, e.stop, e.done)
	started := time.Now()
	port := mr.Port()
	// The store answers INFO only for its clients and stats sections, but
	// clients (redis-cli, monitoring, go-redis's version probe) ask for
	// "INFO server" first. The section says what this is: not a Redis, an
	// embedded store standing in for the version of the command table.
	mr.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		switch {
		case cmd == "INFO":
			c.WriteBulk(embeddedInfo(mr, args, port, started))
			return true
		case cmd == "COMMAND" && len(args) > 0:
			// The store answers every COMMAND subcommand with the whole
			// table, and redis-cli (interactive or reading stdin) asks
			// COMMAND DOCS first and aborts on that answer's shape: the
			// quick start's first redis-cli session crashed. Refused as
			// by a server without them, which redis-cli falls back from.
			c.WriteError(fmt.Sprintf("ERR unknown subcommand '%s'. Try COMMAND HELP.", args[0]))
			return true
		case !mr.Server().IsRegisteredCommand(cmd):
			// The proxy's table is Redis's, so it forwards commands the
			// store lacks (FUNCTION, SORT, ...), which answered them in
			// its own words (backquotes) and never said why, while INFO
			// says Redis 7.0 (found by a probe). Redis's words, and why.
			c.WriteError(embeddedUnknown(cmd, args))
			return true
		}
		return false
	})
	return e, nil
}

// embeddedUnknown is Redis's unknown-command error for a command the
// embedded store lacks, with the reason.
func embeddedUnknown(cmd string, args []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ERR unknown command '%s', with args beginning with: ", strings.ToLower(cmd))
	for _, a := range args[:min(len(args), 3)] {
		fmt.Fprintf(&b, "'%s' ", strings.NewReplacer("\r", " ", "\n", " ").Replace(a))
	}
	if commands.Builtin().Lookup([][]byte{[]byte(cmd)}) == nil {
		// Redis lacks it too: Redis's words alone, not a hint that a
		// Redis would run it (found by a probe).
		return b.String()
	}
	b.WriteString("(redproxy's embedded demo store lacks this command; run redproxy with --upstream pointing at a Redis)")
	return b.String()
}

// embeddedInfo answers INFO for the sections asked (none, "default",
// "all" or "everything": every one), as Redis does: the store answered
// only "clients" and "stats" and refused the rest without an ERR code
// ("-section (all) is not supported"), so INFO with no argument lacked the
// server section that says this is not Redis, and INFO all (what
// monitoring asks) failed (found by a probe). Unknown sections are left
// out, as Redis leaves them out.
func embeddedInfo(mr *miniredis.Miniredis, args []string, port string, started time.Time) string {
	all := len(args) == 0
	want := map[string]bool{}
	for _, a := range args {
		switch a = strings.ToLower(a); a {
		case "default", "all", "everything":
			all = true
		default:
			want[a] = true
		}
	}
	sections := []struct {
		name string
		body func() []string
	}{
		{"server", func() []string { return embeddedServerLines(port, started) }},
		{"clients", func() []string {
			return []string{"connected_clients:" + strconv.Itoa(mr.CurrentConnectionCount())}
		}},
		{"persistence", func() []string { return []string{"loading:0", "aof_enabled:0", "rdb_bgsave_in_progress:0"} }},
		{"stats", func() []string {
			return []string{"total_connections_received:" + strconv.Itoa(mr.TotalConnectionCount()),
				"total_commands_processed:" + strconv.Itoa(mr.CommandCount())}
		}},
		{"replication", func() []string { return []string{"role:master", "connected_slaves:0"} }},
		{"keyspace", func() []string {
			var lines []string
			for db := range 16 {
				if n := len(mr.DB(db).Keys()); n > 0 {
					lines = append(lines, fmt.Sprintf("db%d:keys=%d", db, n))
				}
			}
			return lines
		}},
	}
	var b strings.Builder
	for _, sec := range sections {
		if !all && !want[sec.name] {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + strings.ToUpper(sec.name[:1]) + sec.name[1:] + "\r\n")
		for _, l := range sec.body() {
			b.WriteString(l + "\r\n")
		}
	}
	return b.String()
}

func embeddedServerLines(port string, started time.Time) []string {
	up := int64(time.Since(started).Seconds())
	return []string{
		"redis_version:" + commands.BuiltinRedisVersion,
		"redis_mode:standalone",
		"redproxy_embedded_store:yes (in-process demo store, not Redis; data is lost on exit)",
		"os:" + runtime.GOOS,
		"arch_bits:" + strconv.Itoa(strconv.IntSize),
		"process_id:" + strconv.Itoa(os.Getpid()),
		"tcp_port:" + port,
		fmt.Sprintf("uptime_in_seconds:%d", up),
		fmt.Sprintf("uptime_in_days:%d", up/86400),
	}
}
