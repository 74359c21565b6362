package sentinel

import (
	"io"
	"log/slog"
	"net"
	"testing"
)

// TestCloseTwice: Server.Shutdown may be called twice, and each closes the
// watcher; the second Close panicked (close of closed channel). Both a
// started watcher and one only used for Discover (FindSentinelPrimary)
// may be closed again.
func TestCloseTwice(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a Sentinel that is down: the watcher keeps retrying it
	for _, start := range []bool{true, false} {
		w := New(Options{
			Sentinels: []string{addr}, MasterName: "mymaster",
			Role:   func(string) ([]byte, error) { return nil, io.EOF },
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if start {
			w.Start("")
		}
		w.Close()
		w.Close()
	}
}
