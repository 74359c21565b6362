package proxy_test

// HELLO's refusals, compared with Redis's. Redis parses the protocol
// version as any long long: a 19-digit version within int64 is a version
// it does not support (-NOPROTO), not "not an integer"; the proxy's
// integer parser stopped at 18 digits and answered "-ERR Protocol version
// is not an integer or out of range" for HELLO 1000000000000000000 (found
// by review).

import (
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func TestHelloErrors(t *testing.T) {
	direct := redistest.Start(t)
	p := proxytest.Start(t, nil, nil)
	compareWithRedis(t, direct.Addr(), p.Addr, [][]string{
		{"HELLO", "4"}, {"HELLO", "1"}, {"HELLO", "0"}, {"HELLO", "abc"}, {"HELLO", "-3"}, {"HELLO", "03"}, {"HELLO", "+3"},
		{"HELLO", "1000000000000000000"}, {"HELLO", "-1000000000000000000"}, {"HELLO", "4294967299"},
		{"HELLO", "9223372036854775807"}, {"HELLO", "-9223372036854775808"},
		{"HELLO", "9223372036854775808"}, {"HELLO", "-9223372036854775809"}, {"HELLO", "99999999999999999999"},
		{"HELLO", "3", "SETNAME"}, {"HELLO", "3", "foo"},
		{"HELLO", "3", "AUTH", "default"}, {"HELLO", "3", "SETNAME", "a b"},
		{"HELLO", "3", "AUTH", "nobody", "x"}, {"HELLO", "3", "SETNAME", "a b", "AUTH", "nobody", "x"},
		{"HELLO", "3", "AUTH", "nobody", "x", "SETNAME", "a b"}, {"HELLO", "3", "SETNAME", "ok", "bad"},
	})
}
