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

// startEmbedded runs the in-process demo store on a loopback port.
func startEmbedded() (*miniredis.Miniredis, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, err
	}
	started := time.Now()
	port := mr.Port()
	// The store answers INFO only for its clients and stats sections, but
	// clients (redis-cli, monitoring, go-redis's version probe) ask for
	// "INFO server" first. The section says what this is: not a Redis, an
	// embedded store standing in for the version of the command table.
	mr.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		switch {
		case cmd == "INFO" && len(args) == 1 && strings.EqualFold(args[0], "server"):
			c.WriteBulk(embeddedServerInfo(port, started))
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
	return mr, nil
}

// embeddedUnknown is Redis's unknown-command error for a command the
// embedded store lacks, with the reason.
func embeddedUnknown(cmd string, args []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ERR unknown command '%s', with args beginning with: ", strings.ToLower(cmd))
	for _, a := range args[:min(len(args), 3)] {
		fmt.Fprintf(&b, "'%s' ", strings.NewReplacer("\r", " ", "\n", " ").Replace(a))
	}
	b.WriteString("(redproxy's embedded demo store lacks this command; run redproxy with --upstream pointing at a Redis)")
	return b.String()
}

func embeddedServerInfo(port string, started time.Time) string {
	up := int64(time.Since(started).Seconds())
	lines := []string{
		"# Server",
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
	return strings.Join(lines, "\r\n") + "\r\n"
}
