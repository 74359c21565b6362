package resp

import (
	"bytes"
	"strconv"
	"testing"
)

// FuzzSplitCommand: any bytes give arguments or an error, never a panic.
// Arguments given point into raw, each followed there by CRLF (the
// framing was checked), and survive a round trip through the encoding.
func FuzzSplitCommand(f *testing.F) {
	f.Add([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"))
	f.Add([]byte("*1\r\n$-1\r\n"))
	f.Add([]byte("*3\r\n$3\r\nSET\r\n$1\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		args, err := SplitCommand(raw, nil)
		if err != nil {
			return
		}
		var enc bytes.Buffer
		enc.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
		for _, a := range args {
			// a is raw[off:off+len(a)]: its capacity says where.
			off := cap(raw) - cap(a)
			if end := off + len(a); end+2 > len(raw) || string(raw[end:end+2]) != "\r\n" {
				t.Fatalf("%q: argument %q is not followed by CRLF", raw, a)
			}
			enc.WriteString("$" + strconv.Itoa(len(a)) + "\r\n")
			enc.Write(a)
			enc.WriteString("\r\n")
		}
		again, err := SplitCommand(enc.Bytes(), nil)
		if err != nil || len(again) != len(args) {
			t.Fatalf("%q: re-encoded %q gives %q, %v", raw, enc.Bytes(), again, err)
		}
		for i := range args {
			if !bytes.Equal(args[i], again[i]) {
				t.Fatalf("%q: argument %d %q became %q", raw, i, args[i], again[i])
			}
		}
	})
}

// ArrayElements gives back the framed elements of an array reply, and
// refuses what is not one whole array.
func TestArrayElements(t *testing.T) {
	e, ok := ArrayElements([]byte("*2\r\n$1\r\na\r\n:5\r\n"))
	if !ok || len(e) != 2 || string(e[0]) != "$1\r\na\r\n" || string(e[1]) != ":5\r\n" {
		t.Fatalf("got %q, %v", e, ok)
	}
	for _, bad := range []string{"*2\r\n$1\r\na\r\n", "*1\r\n:1\r\n:2\r\n", "$1\r\na\r\n", "*99999999999\r\n"} {
		if _, ok := ArrayElements([]byte(bad)); ok {
			t.Errorf("ArrayElements(%q) ok", bad)
		}
	}
	if !IsNull([]byte("$-1\r\n")) || !IsNull([]byte("_\r\n")) || IsNull([]byte("$0\r\n\r\n")) {
		t.Error("IsNull")
	}
}
