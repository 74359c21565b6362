package resp

import "testing"

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
	}
}
