package upstream

import (
	"bytes"
	"testing"
)

// Trim gives back a reply buffer grown past keep and keeps a smaller one.
func TestCallTrim(t *testing.T) {
	c := NewCall()
	c.addReply(bytes.Repeat([]byte("x"), 100<<10))
	c.Reset()
	c.Trim(64 << 10)
	if cap(c.out) != 0 {
		t.Fatalf("kept %d bytes of replies after Trim", cap(c.out))
	}
	c.addReply([]byte("+OK\r\n"))
	c.Reset()
	kept := cap(c.out)
	c.Trim(64 << 10)
	if kept == 0 || cap(c.out) != kept {
		t.Fatalf("small reply buffer: %d before Trim, %d after", kept, cap(c.out))
	}
}
