package auth

import (
	"strings"
	"testing"
)

// A user's namespace must be a prefix that can confine keys; the error
// points at the entry.
func TestValidateNamespace(t *testing.T) {
	u := UserConfig{Name: "ci", PasswordSHA256: HashPassword("pw"), ACL: "+@all ~*", Namespace: "run-*:"}
	err := Validate([]UserConfig{u}, nil)
	if err == nil || !strings.Contains(err.Error(), "users[0].namespace") {
		t.Fatalf("namespace with a glob character: %v, want an error on users[0].namespace", err)
	}
	u.Namespace = "run-42:"
	us, err := New([]UserConfig{u}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := us.Get("ci").Namespace; got != "run-42:" {
		t.Fatalf("Namespace = %q", got)
	}
}
