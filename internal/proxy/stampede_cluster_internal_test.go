package proxy

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/stampede"
)

// In cluster mode [stampede] does nothing, and the proxy says so at start:
// a warning when hold or early refresh rules are set, a line of
// information for coalescing alone (on by default), nothing when all is
// off.
func TestStampedeInClusterIsSaidToDoNothing(t *testing.T) {
	hold := stampede.DefaultConfig()
	hold.Hold = []stampede.HoldRule{{Pattern: "product:*"}}
	off := stampede.DefaultConfig()
	off.Coalesce = false
	for _, c := range []struct {
		name string
		cfg  stampede.Config
		want string
	}{
		{"hold rules", hold, "level=WARN"},
		{"coalescing", stampede.DefaultConfig(), "level=INFO"},
		{"all off", off, ""},
	} {
		var buf bytes.Buffer
		warnStampedeInCluster(slog.New(slog.NewTextHandler(&buf, nil)), c.cfg)
		got := buf.String()
		if c.want == "" && got != "" || c.want != "" && (!strings.Contains(got, c.want) || !strings.Contains(got, "cluster mode")) {
			t.Errorf("%s: logged %q, want %q", c.name, got, c.want)
		}
	}
}
