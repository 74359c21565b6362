package cluster

import (
	"testing"
)

// FuzzTopologyReply: a node's CLUSTER SHARDS or CLUSTER SLOTS reply, however
// malformed, yields a map or an error, never a panic, and a map it yields
// routes every slot to "" or to a node the map lists.
func FuzzTopologyReply(f *testing.F) {
	f.Add([]byte("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"))
	f.Add([]byte("*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*6\r\n$4\r\nport\r\n:7000\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"))
	f.Add([]byte("*1\r\n%2\r\n$5\r\nslots\r\n*2\r\n:5\r\n:1\r\n$5\r\nnodes\r\n*0\r\n"))
	f.Add([]byte("-ERR unknown subcommand\r\n"))
	f.Fuzz(func(t *testing.T, reply []byte) {
		shardsTLS := func(reply []byte, from string) (*Map, error) { return parseShards(reply, from, true) }
		shards := func(reply []byte, from string) (*Map, error) { return parseShards(reply, from, false) }
		for _, parse := range []func([]byte, string) (*Map, error){shards, shardsTLS, parseSlots} {
			m, err := parse(reply, "10.0.0.1:7000")
			if err != nil {
				continue
			}
			known := map[string]bool{"": true}
			for _, a := range m.primaries {
				known[a] = true
			}
			for s := range Slots {
				if !known[m.Owner(s)] {
					t.Fatalf("slot %d routed to unknown %q", s, m.Owner(s))
				}
			}
			_ = m.fingerprint()
		}
	})
}
