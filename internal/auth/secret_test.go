package auth

import "testing"

func TestSecretEqual(t *testing.T) {
	for _, c := range []struct {
		got, want string
		equal     bool
	}{
		{"s3cret", "s3cret", true},
		{"", "", true},
		{"s3cret", "s3creT", false},
		{"s3cre", "s3cret", false},
		{"s3cret!", "s3cret", false},
		{"", "s3cret", false},
	} {
		if got := SecretEqual([]byte(c.got), []byte(c.want)); got != c.equal {
			t.Errorf("SecretEqual(%q, %q) = %v, want %v", c.got, c.want, got, c.equal)
		}
	}
}
