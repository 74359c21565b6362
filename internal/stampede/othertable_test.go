package stampede

import (
	"context"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The proxy's command table follows its upstream (internal/proxy,
// cmdtable.go): a table read after a Protection was built has commands of
// its own, which are not the pointers New saw. A read looked up in such a
// table is still coalesced when its command is coalescable, and a
// subcommand still is not. Before, only New's table's commands were
// eligible: after a reload to another Redis no read was coalesced or held
// until the next [stampede] reload.
func TestReadOfACommandFromAnotherTable(t *testing.T) {
	rs := redistest.Start(t)
	loaded, err := commands.Load(context.Background(), rs.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	fetches := 0
	fetch := func(db int, resp3 bool, cmd, then, dst []byte) ([]byte, error) {
		fetches++
		return append(dst, "$1\r\nv\r\n"...), nil
	}
	p := New(Config{Coalesce: true, MaxWaiters: 10}, commands.Builtin(), NewMetrics(nil), fetch)
	get := loaded.Get("get")
	if get == nil || get == commands.Builtin().Get("get") {
		t.Fatal("the loaded table has no GET of its own")
	}
	args := [][]byte{[]byte("get"), []byte("k")}
	out, handled, err := p.Read(get, args, []byte("*2\r\n$3\r\nget\r\n$1\r\nk\r\n"), 0, false, 1, nil, nil)
	if err != nil || !handled || string(out) != "$1\r\nv\r\n" || fetches != 1 {
		t.Fatalf("GET of a table read later: handled=%v out=%q err=%v fetches=%d, want coalesced (handled, one fetch)", handled, out, err, fetches)
	}
	enc := loaded.Lookup([][]byte{[]byte("object"), []byte("encoding"), []byte("k")})
	if enc == nil || enc.Parent == nil {
		t.Fatal("OBJECT ENCODING is not a subcommand in the loaded table")
	}
	if _, handled, _ := p.Read(enc, [][]byte{[]byte("object"), []byte("encoding"), []byte("k")}, nil, 0, false, 1, nil, nil); handled {
		t.Fatal("OBJECT ENCODING of a table read later was coalesced; subcommands never are")
	}
}
