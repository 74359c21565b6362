package proxy

import "testing"

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
