package proxy

import (
	"slices"
	"strconv"
	"testing"
)

// TestReplicaInfoParsing: the fields the poller reads from INFO
// replication, as Redis 7.0 writes them, and the replicas a standalone
// primary lists (only those online).
func TestReplicaInfoParsing(t *testing.T) {
	body := "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n" +
		"slave0:ip=127.0.0.1,port=7001,state=online,offset=1234,lag=0\r\n" +
		"slave1:ip=10.0.0.2,port=7002,state=wait_bgsave,offset=0,lag=0\r\n" +
		"slave2:ip=::1,port=7003,state=online,offset=1200,lag=1\r\n" +
		"master_failover_state:no-failover\r\nmaster_replid:abc\r\nmaster_repl_offset:1234\r\nsecond_repl_offset:-1\r\n"
	reply := []byte("$" + strconv.Itoa(len(body)) + "\r\n" + body + "\r\n")
	f := infoFields(reply)
	if f["role"] != "master" || f["master_repl_offset"] != "1234" || f["second_repl_offset"] != "-1" {
		t.Fatalf("fields = %v", f)
	}
	rs := &replicaSet{srv: &Server{}}
	got := rs.discover(reply)
	slices.Sort(got)
	if want := []string{"127.0.0.1:7001", "[::1]:7003"}; !slices.Equal(got, want) {
		t.Fatalf("discover = %q, want %q (online replicas only)", got, want)
	}
	replica := infoFields([]byte("$100\r\n# Replication\r\nrole:slave\r\nmaster_link_status:up\r\nmaster_sync_in_progress:0\r\nslave_read_repl_offset:99\r\nslave_repl_offset:77\r\n"))
	if replica["slave_repl_offset"] != "77" || replica["master_link_status"] != "up" {
		t.Fatalf("replica fields = %v", replica)
	}
}
