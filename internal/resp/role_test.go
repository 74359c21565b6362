package resp

import (
	"strings"
	"testing"
)

func TestHelloID(t *testing.T) {
	const tail = "$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:42\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"
	for _, tc := range []struct {
		name  string
		reply string
		want  int64
	}{
		{"RESP3 map", "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n" + tail, 42},
		{"RESP2 array", "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n" + tail, 42},
		// A value spelled like the key is a value: the search for the
		// key's bytes read the next key as the id.
		{"value named id", "%7\r\n$6\r\nserver\r\n$2\r\nid\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n" + tail, 42},
		{"no id", "%1\r\n$6\r\nserver\r\n$5\r\nredis\r\n", 0},
		{"error", "-NOPROTO unsupported protocol version\r\n", 0},
		{"truncated", "%7\r\n$6\r\nserver\r\n", 0},
	} {
		if got := HelloID([]byte(tc.reply)); got != tc.want {
			t.Errorf("%s: HelloID = %d, want %d", tc.name, got, tc.want)
		}
		wantVersion := ""
		if strings.Contains(tc.reply, "$7\r\nversion\r\n$5\r\n7.0.0\r\n") {
			wantVersion = "7.0.0"
		}
		if got := HelloVersion([]byte(tc.reply)); got != wantVersion {
			t.Errorf("%s: HelloVersion = %q, want %q", tc.name, got, wantVersion)
		}
	}
}

// Replies of Redis 7.0.15 to FUNCTION STATS, idle and while a function
// runs, in both protocols.
func TestFunctionStatsRunning(t *testing.T) {
	const engines2 = "$7\r\nengines\r\n*2\r\n$3\r\nLUA\r\n*4\r\n$15\r\nlibraries_count\r\n:1\r\n$15\r\nfunctions_count\r\n:1\r\n"
	const engines3 = "$7\r\nengines\r\n%1\r\n$3\r\nLUA\r\n%2\r\n$15\r\nlibraries_count\r\n:1\r\n$15\r\nfunctions_count\r\n:1\r\n"
	const running = "$4\r\nname\r\n$4\r\nspin\r\n$7\r\ncommand\r\n*3\r\n$5\r\nFCALL\r\n$4\r\nspin\r\n$1\r\n0\r\n$11\r\nduration_ms\r\n:300\r\n"
	for _, tc := range []struct {
		name, reply string
		want        bool
	}{
		{"RESP2 idle", "*4\r\n$14\r\nrunning_script\r\n$-1\r\n" + engines2, false},
		{"RESP3 idle", "%2\r\n$14\r\nrunning_script\r\n_\r\n" + engines3, false},
		{"RESP2 running", "*4\r\n$14\r\nrunning_script\r\n*6\r\n" + running + engines2, true},
		{"RESP3 running", "%2\r\n$14\r\nrunning_script\r\n%3\r\n" + running + engines3, true},
		{"busy", "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n", false},
		{"truncated", "*4\r\n$14\r\nrunning_script\r\n*6\r\n$4\r\nname\r\n", false},
	} {
		if got := FunctionStatsRunning([]byte(tc.reply)); got != tc.want {
			t.Errorf("%s: FunctionStatsRunning = %v, want %v", tc.name, got, tc.want)
		}
	}
}
