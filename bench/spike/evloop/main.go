// Command evloop is issue 10's design spike 2: a pass-through Redis proxy
// on gnet event loops, with each loop's upstream connections adopted into
// the loop. It exists to be measured by bench/run.sh (--extra-proxy) and
// compared with redproxy and twemproxy; see bench/README.md, "Spike 2".
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7480", "client address")
	upstream := flag.String("upstream", "127.0.0.1:6380", "Redis address")
	pipes := flag.Int("upstream-conns", 1, "upstream connections per event loop")
	loops := flag.Int("loops", 0, "event loops (0: one per CPU the process may run on)")
	flush := flag.String("flush", "loop", "when requests go upstream: loop (once per loop iteration) or immediate (after each client read)")
	logLevel := flag.String("log-level", "warn", "debug, info, warn or error")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "evloop: -log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(*listen, *upstream, *pipes, *loops, *flush, log); err != nil {
		log.Error("evloop stopped", "err", err)
		os.Exit(1)
	}
}

func run(listen, upstream string, pipes, loops int, flush string, log *slog.Logger) error {
	addr, err := net.ResolveTCPAddr("tcp", upstream)
	if err != nil {
		return err
	}
	if pipes < 1 {
		return fmt.Errorf("-upstream-conns must be at least 1")
	}
	mode := flushLoop
	switch flush {
	case "loop":
	case "immediate":
		mode = flushImmediate
	default:
		return fmt.Errorf("-flush must be loop or immediate, not %q", flush)
	}
	p := newProxy(addr, pipes, mode, log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gnet.Stop(sctx, "tcp://"+listen)
	}()
	opts := []gnet.Option{
		gnet.WithMulticore(loops == 0),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogLevel(logging.ErrorLevel),
	}
	if loops > 0 {
		opts = append(opts, gnet.WithNumEventLoop(loops))
	}
	return gnet.Run(p, "tcp://"+listen, opts...)
}
