package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// tableWithSetinfo is the built-in table (Redis 7.0's) plus CLIENT SETINFO
// as Redis 7.2 and later report it, which is the table the proxy loads
// from such an upstream (the redis-server here is 7.0, without it).
func tableWithSetinfo() *commands.Table {
	var cmds []*commands.Command
	for _, c := range commands.Builtin().Commands() {
		nc := *c
		if c.Subcommands != nil {
			nc.Subcommands = make(map[string]*commands.Command, len(c.Subcommands)+1)
			for k, s := range c.Subcommands {
				ns := *s
				nc.Subcommands[k] = &ns
			}
		}
		if c.Name == "client" {
			nc.Subcommands["setinfo"] = &commands.Command{Name: "client|setinfo", Arity: 4,
				Flags: commands.NoScript | commands.Loading | commands.Stale | commands.CatSlow | commands.CatConnection}
		}
		cmds = append(cmds, &nc)
	}
	return commands.NewTable(cmds)
}

// CLIENT SETINFO lib-name/lib-ver is answered by the proxy, which stores
// the value as it is: Redis (7.2, where SETINFO exists) refuses one with
// spaces, newlines or other characters outside '!'..'~' ("lib-name cannot
// contain spaces, newlines or special characters"), as it does for
// CLIENT SETNAME, which the proxy does check (validClientName). Unchecked,
// one client writes whole forged lines into every other client's CLIENT
// LIST (another id, address, name and user=), which monitoring and CLIENT
// KILL scripts parse.
func TestReviewClientSetinfoInjectsClientListLines(t *testing.T) {
	p := proxytest.StartWithTable(t, nil, tableWithSetinfo(), nil)
	addr := p.Addr

	evil := dialRaw(t, addr)
	if v := fmt.Sprint(evil.do("CLIENT", "SETNAME", "a\nb")); !strings.Contains(v, "cannot contain") {
		t.Fatalf("CLIENT SETNAME with a newline = %q; want the refusal", v)
	}
	forged := "x\nid=4242 addr=203.0.113.9:4242 laddr=1.2.3.4:6380 fd=9 name=admin-console age=1 idle=0 flags=N db=0 user=admin lib-name=y"
	reply := fmt.Sprint(evil.do("CLIENT", "SETINFO", "lib-name", forged))
	viewer := dialRaw(t, addr)
	list := fmt.Sprint(viewer.do("CLIENT", "LIST"))
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(list, "\n"), "\n") {
		if strings.HasPrefix(l, "id=4242 ") {
			lines = append(lines, l)
		}
	}
	if reply == "OK" || len(lines) > 0 {
		t.Errorf("CLIENT SETINFO lib-name with a newline = %q (Redis 7.2 refuses it); CLIENT LIST seen by another client now has a forged entry: %q", reply, lines)
	}
}
