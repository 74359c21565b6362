package proxy

import (
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

// TestUnknownCommandText: the proxy's unknown command and subcommand errors
// are redis-server 7.0.15's, byte for byte (each want was read from a raw
// socket): strings cut at their first NUL, the name at 128 bytes, the
// arguments' text at about 128, \r and \n made spaces, other bytes kept.
func TestUnknownCommandText(t *testing.T) {
	a50, a200 := strings.Repeat("a", 50), strings.Repeat("a", 200)
	x200 := strings.Repeat("X", 200)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"KEY\x00S", "*"}, "-ERR unknown command 'KEY', with args beginning with: '*' \r\n"},
		{[]string{"KEYS\x00abc", "*"}, "-ERR unknown command 'KEYS', with args beginning with: '*' \r\n"},
		{[]string{"FOO\x01\x7fbar\xff", "a\x00b", "c\r\nd"}, "-ERR unknown command 'FOO\x01\x7fbar\xff', with args beginning with: 'a' 'c  d' \r\n"},
		{[]string{"CONFIG", "SET\x00x", "slowlog-max-len", "1"}, "-ERR unknown subcommand 'SET'. Try CONFIG HELP.\r\n"},
		{[]string{"CONFIG\x00x", "SET", "x"}, "-ERR unknown command 'CONFIG', with args beginning with: 'SET' 'x' \r\n"},
		{[]string{"client", "setname\x00", "x"}, "-ERR unknown subcommand 'setname'. Try CLIENT HELP.\r\n"},
		{[]string{"FOO", a50, a50, a50, a50, a50}, "-ERR unknown command 'FOO', with args beginning with: '" + a50 + "' '" + a50 + "' '" + a50[:22] + "' \r\n"},
		{[]string{"FOO", a200, "b"}, "-ERR unknown command 'FOO', with args beginning with: '" + a200[:128] + "' \r\n"},
		{[]string{x200}, "-ERR unknown command '" + x200[:128] + "', with args beginning with: \r\n"},
	}
	tab := commands.Builtin()
	for _, tc := range cases {
		var args [][]byte
		for _, a := range tc.args {
			args = append(args, []byte(a))
		}
		var got string
		if msg := nulNameMsg(tab.Lookup(args), args); msg != "" {
			got = "-" + msg + "\r\n"
		} else {
			got = string(errUnknownCommand(args))
		}
		if got != tc.want {
			t.Errorf("%q:\n got %q\nwant %q", tc.args, got, tc.want)
		}
	}
}
