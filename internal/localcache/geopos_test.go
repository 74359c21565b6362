package localcache

import (
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/redistest"
)

// GEOPOS marks a missing member with *-1 for RESP2 clients and _ for RESP3
// ones; a reply with only missing members has no doubles, so it is
// converted, and must come out as Redis's own RESP2 bytes.
func TestGeoposNullsMatchRedis(t *testing.T) {
	rs := redistest.Start(t)
	r2, r3 := dialRaw(t, rs.Addr(), false), dialRaw(t, rs.Addr(), true)
	r2.do("GEOADD", "geo", "13.361389", "38.115556", "Palermo")
	geopos := commands.Builtin().Get("geopos")
	converted := 0
	for _, c := range [][]string{
		{"GEOPOS", "geo", "Nowhere"},
		{"GEOPOS", "geo", "Nowhere", "Nada"},
		{"GEOPOS", "missing", "a", "b"},
		{"GEOPOS", "geo"},
		{"GEOPOS", "geo", "Palermo", "Nowhere"},
	} {
		want := r2.do(c...)
		out, ok := toRESP2For(geopos, r3.do(c...))
		if !ok {
			continue // doubles: refused, so never served from the tier
		}
		converted++
		if string(out) != string(want) {
			t.Errorf("%s: converted %q, Redis sends RESP2 clients %q", strings.Join(c, " "), out, want)
		}
	}
	if converted < 3 {
		t.Fatalf("only %d GEOPOS replies converted; the test checks nothing", converted)
	}
}
