package proxy_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

var (
	fuzzAuthOnce  sync.Once
	fuzzAuthProxy *proxytest.Proxy
)

// fuzzAuthPass is the password of the fuzz proxy's user "app"; the seeds
// log in with it, so the fuzzer explores both sides of AUTH.
const fuzzAuthPass = "fuzz-pw-5d1e"

// FuzzAuthPath sends arbitrary bytes, built around AUTH, HELLO and RESET,
// to a proxy with proxy users, and checks that the proxy answers or closes
// that connection without hanging, and that a fresh client can still log
// in and be served afterwards.
//
// The fuzzed client connects from 127.0.0.2 and the checking client from
// 127.0.0.1: failed AUTH is rate-limited per address, and the fuzzer's
// wrong passwords must not lock out the client that checks the proxy.
func FuzzAuthPath(f *testing.F) {
	login := "AUTH app " + fuzzAuthPass + "\r\n"
	for _, s := range []string{
		"AUTH\r\n",
		"AUTH x\r\n",
		"AUTH app wrong\r\n",
		login,
		"AUTH " + fuzzAuthPass + "\r\n", // the default user's form
		"*3\r\n$4\r\nAUTH\r\n$3\r\napp\r\n$" + "12\r\n" + fuzzAuthPass + "\r\n",
		"HELLO 3 AUTH app " + fuzzAuthPass + "\r\n",
		"HELLO 3 AUTH app\r\n",
		"HELLO 3 AUTH\r\n",
		"HELLO 2 AUTH app " + fuzzAuthPass + " SETNAME n extra\r\n",
		"HELLO 4\r\nHELLO x y\r\n",
		"RESET\r\nPING\r\n",
		login + "SET k v\r\nRESET\r\nGET k\r\n" + login + "GET k\r\n",
		"HELLO 3 AUTH app " + fuzzAuthPass + "\r\nMULTI\r\nAUTH app wrong\r\nEXEC\r\n",
		login + "WATCH k\r\nAUTH default x\r\nUNWATCH\r\n" + login + "RESET\r\n",
		login + "SUBSCRIBE c\r\nAUTH app " + fuzzAuthPass + "\r\nPING\r\n",
		"AUTH app wrong\r\nAUTH app wrong\r\n" + login + "PING\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzAuthOnce.Do(func() {
			fuzzAuthProxy = startFuzzProxy(t, func(c *config.Config) {
				c.Users = []auth.UserConfig{
					{Name: "app", PasswordSHA256: auth.HashPassword(fuzzAuthPass), ACL: "+@all -@dangerous ~* allchannels"},
					{Name: "default", PasswordSHA256: auth.HashPassword(fuzzAuthPass), ACL: "+@read ~*"},
				}
				c.Policy.Commands.Deny = fuzzDeny
				c.Upstream.ReplyTimeout.Duration = 2 * time.Second
			})
		})
		p := fuzzAuthProxy
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		nc, err := d.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		sendAndDrain(nc, data)
		expectServed(t, p, data, login+"PING\r\n", "+OK\r\n+PONG\r\n")
	})
}
