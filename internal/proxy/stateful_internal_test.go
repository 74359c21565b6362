package proxy

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

func TestStripExec(t *testing.T) {
	reply := []byte("*4\r\n+OK\r\n:1\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n:7\r\n")
	cases := []struct {
		hidden []int
		want   string
	}{
		{nil, string(reply)},
		{[]int{1}, "*3\r\n+OK\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n:7\r\n"},
		{[]int{1, 3}, "*2\r\n+OK\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"},
	}
	for _, c := range cases {
		if got := string(stripExec(reply, c.hidden, nil)); got != c.want {
			t.Errorf("hidden %v: got %q want %q", c.hidden, got, c.want)
		}
	}
	for _, r := range []string{"*-1\r\n", "_\r\n", "-EXECABORT Transaction discarded\r\n"} {
		if got := string(stripExec([]byte(r), []int{0}, nil)); got != r {
			t.Errorf("%q changed to %q", r, got)
		}
	}
}

func TestFirstElement(t *testing.T) {
	for in, want := range map[string]string{
		"*2\r\n:1\r\n:2\r\n":       ":1\r\n",
		"*1\r\n$3\r\nfoo\r\n":      "$3\r\nfoo\r\n",
		"*-1\r\n":                  "*-1\r\n",
		"*0\r\n":                   "*0\r\n",
		"-EXECABORT discarded\r\n": "-EXECABORT discarded\r\n",
	} {
		if got := string(firstElement([]byte(in))); got != want {
			t.Errorf("firstElement(%q) = %q want %q", in, got, want)
		}
	}
}

// appendAnswerScript's scripts make Redis answer exactly the proxy's
// reply, in both protocols: an integer, a status (CLIENT SETINFO's +OK,
// not otherwise reached with Redis before 7.2), an error, and a string
// (CLIENT INFO and LIST's), which Redis frames as a verbatim string on
// RESP3 and a bulk string on RESP2, as its own.
func TestAnswerScriptRoundTrip(t *testing.T) {
	rs := redistest.Start(t)
	nc, err := net.DialTimeout("tcp", rs.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rd := bufio.NewReader(nc)
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	send := func(reply string) string {
		t.Helper()
		b, ok := appendAnswerScript(nil, []byte(reply))
		if !ok {
			t.Fatalf("%q: no script", reply)
		}
		if _, err := nc.Write(b); err != nil {
			t.Fatal(err)
		}
		var got []byte
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, line...)
		if line[0] == '$' || line[0] == '=' {
			n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
			body := make([]byte, n+2)
			if _, err := io.ReadFull(rd, body); err != nil {
				t.Fatal(err)
			}
			got = append(got, body...)
		}
		return string(got)
	}
	info := "id=7 addr=127.0.0.1:1 name= db=0 flags=N\n"
	for _, c := range []struct{ reply, want string }{
		{":7\r\n", ":7\r\n"},
		{"+OK\r\n", "+OK\r\n"},
		{"-ERR Unknown client type 'x'\r\n", "-ERR Unknown client type 'x'\r\n"},
		{"$" + strconv.Itoa(len(info)) + "\r\n" + info + "\r\n", "$" + strconv.Itoa(len(info)) + "\r\n" + info + "\r\n"},
		{"=" + strconv.Itoa(len(info)+4) + "\r\ntxt:" + info + "\r\n", "$" + strconv.Itoa(len(info)) + "\r\n" + info + "\r\n"},
	} {
		if got := send(c.reply); got != c.want {
			t.Errorf("RESP2: %q answered %q, want %q", c.reply, got, c.want)
		}
	}
	nc.Write([]byte("*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"))
	for n := 0; n < 32; n++ { // HELLO's map, up to its last value, modules: *0
		line, _ := rd.ReadString('\n')
		if line[0] == '$' {
			rd.ReadString('\n')
		}
		if line[0] == '*' {
			break
		}
	}
	for _, c := range []struct{ reply, want string }{
		{":7\r\n", ":7\r\n"},
		{"$" + strconv.Itoa(len(info)) + "\r\n" + info + "\r\n", "=" + strconv.Itoa(len(info)+4) + "\r\ntxt:" + info + "\r\n"},
		{"=" + strconv.Itoa(len(info)+4) + "\r\ntxt:" + info + "\r\n", "=" + strconv.Itoa(len(info)+4) + "\r\ntxt:" + info + "\r\n"},
	} {
		if got := send(c.reply); got != c.want {
			t.Errorf("RESP3: %q answered %q, want %q", c.reply, got, c.want)
		}
	}
}
