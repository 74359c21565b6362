package guard_test

import (
	"context"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// Shutdown's interrupt lands while the look-ahead waits for the rest of a
// request (a SET that needs a TTL, then a request cut short), and the
// batch then starts a relay (SUBSCRIBE), which with no idle timeout sets
// no read deadline of its own. Found by review: restoring the session's
// deadline after the wait erased the interrupt's, and the relay read on
// until Shutdown's own deadline. Shutdown must end without reaching it.
func TestShutdownDuringLookaheadWait(t *testing.T) {
	for _, tc := range []struct{ name, send string }{
		{"no look-ahead", "*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n*5\r\n$3\r\nSET\r\n$5\r\ns:key\r\n$1\r\nv\r\n$2\r\nEX\r\n$2\r\n10\r\n*1\r\n"},
		{"look-ahead", "*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n*3\r\n$3\r\nSET\r\n$5\r\ns:key\r\n$1\r\nv\r\n*1\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
			nc := p.Dial(t)
			if _, err := nc.Write([]byte(tc.send)); err != nil {
				t.Fatal(err)
			}
			// Most often inside the look-ahead's 200 ms wait; after it, the
			// shutdown is an ordinary one, which must end too.
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Server.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v; the subscribed client held it to its deadline", err)
			}
		})
	}
}
