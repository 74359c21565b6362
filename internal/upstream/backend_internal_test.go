package upstream

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// A switch swaps the generation, then empties the idle dedicated pipes. A
// pipe taken from the idle list between the two is from before the switch
// and talks to the old upstream: a transaction or blocking command begun
// after the reload must not run there. This runs the interleaving by
// doing the swap, Switch's first step, alone.
func TestIdlePipeFromBeforeSwitchIsNotReused(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	opt := BackendOptions{Addr: a.Addr(), Connections: 1, Databases: 1, MaxPinned: 4, DialTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	p, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	be.ReleasePipe(p, 0, false, true) // clean: kept for reuse
	opt.Addr = b.Addr()
	be.gen.Swap(newGen(opt))

	q, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer be.ReleasePipe(q, 0, false, false)
	c := NewCall()
	c.Add([]byte("*3\r\n$3\r\nSET\r\n$5\r\nwhere\r\n$1\r\nx\r\n"))
	if err := q.Send(c); err != nil {
		t.Fatal(err)
	}
	c.Wait()
	if r, err := c.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("SET: %q %v", r, err)
	}
	if n := a.Client(t).Exists(context.Background(), "where").Val(); n != 0 {
		t.Fatal("a dedicated pipe acquired after the switch wrote to the old upstream")
	}
}
