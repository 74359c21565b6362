package proxy

import (
	"testing"

	"github.com/redproxy/redproxy/internal/upstream"
)

// A client going idle gives back the per-batch buffers a large reply grew,
// and keeps small ones, which a client at -P 1 reuses request after request.
func TestSessionIdleDropsLargeBuffers(t *testing.T) {
	sess := &Session{sessionBatch: &sessionBatch{call: upstream.NewCall()}}
	sess.out = make([]byte, 0, idleKeep+1)
	sess.local = make([]byte, 0, idleKeep+1)
	sess.idle()
	if sess.out != nil || sess.local != nil {
		t.Fatalf("kept %d bytes of output and %d of local replies while idle", cap(sess.out), cap(sess.local))
	}
	small := make([]byte, 0, 4096)
	sess.out, sess.local = small, small
	sess.idle()
	if cap(sess.out) != 4096 || cap(sess.local) != 4096 {
		t.Fatalf("small buffers dropped: %d, %d", cap(sess.out), cap(sess.local))
	}
}
