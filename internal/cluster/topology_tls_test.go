package cluster

import (
	"strconv"
	"testing"
)

// TestParseShardsTLSOnlyNodes: a cluster whose nodes listen on TLS only
// (port 0, tls-port P, tls-cluster yes) answers CLUSTER SHARDS with
// "tls-port" and no "port" for each node (Redis documents that at least one
// of them is present). The README promises that [upstream.tls] covers every
// connection to Redis, and config.example.toml that a cluster upstream takes
// TLS; but nodeAddr reads only "port", drops every node, and the map is
// refused ("malformed cluster topology reply: shard without a primary"), so
// the proxy never serves (seen by hand with redis-server 7.0.15). Found by
// review (modes, 2026-12-06). (With both ports open, "port" is the
// plaintext one and the proxy dials it with TLS: "no TLS answer in time".)
func TestParseShardsTLSOnlyNodes(t *testing.T) {
	node := func(tlsPort int, role string) string {
		return "*10\r\n$2\r\nid\r\n$1\r\nx\r\n$8\r\ntls-port\r\n:" + strconv.Itoa(tlsPort) +
			"\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$" + strconv.Itoa(len(role)) + "\r\n" + role +
			"\r\n$6\r\nhealth\r\n$6\r\nonline\r\n"
	}
	shards := "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*2\r\n" +
		node(17501, "master") + node(17502, "replica")
	m, err := parseShards([]byte(shards), "127.0.0.1:17501", true)
	if err != nil {
		t.Fatalf("CLUSTER SHARDS of a TLS-only cluster: %v", err)
	}
	if got := m.Owner(0); got != "127.0.0.1:17501" {
		t.Fatalf("owner of slot 0 = %q, want the node's tls-port 127.0.0.1:17501", got)
	}
}

// TestParseShardsBothPorts: a node listening on both ports lists "port"
// (plaintext) and "tls-port": over TLS the proxy dials the TLS one (it
// dialled the plaintext port with TLS: "no TLS answer in time"), without
// TLS the plaintext one; a node listing no tls-port is dialled at its port
// either way (TLS by a sidecar in front of it).
func TestParseShardsBothPorts(t *testing.T) {
	node := func(fields ...string) string {
		s := "*" + strconv.Itoa(len(fields)) + "\r\n"
		for _, f := range fields {
			if f[0] == ':' {
				s += f + "\r\n"
			} else {
				s += "$" + strconv.Itoa(len(f)) + "\r\n" + f + "\r\n"
			}
		}
		return s
	}
	shards := "*2\r\n" +
		"*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:8191\r\n$5\r\nnodes\r\n*1\r\n" +
		node("port", ":17511", "tls-port", ":17611", "ip", "127.0.0.1", "role", "master", "health", "online") +
		"*4\r\n$5\r\nslots\r\n*2\r\n:8192\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n" +
		node("port", ":17512", "ip", "127.0.0.1", "role", "master", "health", "online")
	for _, c := range []struct {
		tls       bool
		low, high string
	}{{true, "127.0.0.1:17611", "127.0.0.1:17512"}, {false, "127.0.0.1:17511", "127.0.0.1:17512"}} {
		m, err := parseShards([]byte(shards), "127.0.0.1:17511", c.tls)
		if err != nil {
			t.Fatalf("tls=%v: %v", c.tls, err)
		}
		if got := m.Owner(0); got != c.low {
			t.Errorf("tls=%v: slot 0 owned by %q, want %q", c.tls, got, c.low)
		}
		if got := m.Owner(16383); got != c.high {
			t.Errorf("tls=%v: slot 16383 owned by %q, want %q", c.tls, got, c.high)
		}
	}
}
