package proxy

import (
	"errors"
	"testing"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/namespace"
)

// The listener's namespace applies until the client is a user with a
// namespace of its own; a user without one, or none, brings it back.
func TestSessionNamespacePrecedence(t *testing.T) {
	sess := &Session{sessionBatch: &sessionBatch{}}
	prefix := func() string {
		if sess.ns.w == nil {
			return ""
		}
		return sess.ns.w.Namespace().Prefix()
	}
	if err := sess.setNamespace("listener:"); err != nil {
		t.Fatal(err)
	}
	if got := prefix(); got != "listener:" {
		t.Fatalf("after setNamespace: %q", got)
	}
	sess.user = &auth.User{Name: "u", Namespace: "user:"}
	sess.applyNamespace()
	if got := prefix(); got != "user:" {
		t.Fatalf("a user with a namespace: %q, want user:", got)
	}
	sess.user = &auth.User{Name: "plain"}
	sess.applyNamespace()
	if got := prefix(); got != "listener:" {
		t.Fatalf("a user without a namespace: %q, want the listener's", got)
	}
	sess.user = nil
	if err := sess.setNamespace(""); err != nil || prefix() != "" {
		t.Fatalf("setNamespace(\"\"): %v, %q", err, prefix())
	}
	if err := sess.setNamespace("bad*"); !errors.Is(err, namespace.ErrBadPrefix) {
		t.Fatalf("setNamespace(bad*): %v", err)
	}
	if prefix() != "" {
		t.Fatal("a refused prefix changed the namespace")
	}
}
