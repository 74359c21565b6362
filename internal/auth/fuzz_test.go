package auth

import (
	"bytes"
	"os"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

func writeFile(name, s string) error { return os.WriteFile(name, []byte(s), 0o600) }

// FuzzParseACL feeds arbitrary rule strings to the parser and arbitrary
// calls to the checker: neither may panic, a parsed ACL must parse again
// from its String() to one that decides the same, and the fuzzed call is
// never allowed on keys when the ACL has no key pattern.
func FuzzParseACL(f *testing.F) {
	for _, s := range []string{
		"+@all -@dangerous ~cache:* ~session:*",
		"+@read %R~cache:* %W~out:*",
		"-@all +client|setname +get allkeys",
		"allcommands resetkeys ~a[bc]* nocommands +sort",
		"+@all ~\\",
	} {
		f.Add(s, "sort cache:a store out:b")
		f.Add(s, "eval s 2 a b")
	}
	tab := commands.Builtin()
	f.Fuzz(func(t *testing.T, rules, call string) {
		a, err := ParseACL(rules, tab)
		if err != nil {
			return
		}
		b, err := ParseACL(a.String(), tab)
		if err != nil {
			t.Fatalf("String() %q of %q does not parse: %v", a.String(), rules, err)
		}
		av := bytes.Fields([]byte(call))
		cmd := tab.Lookup(av)
		d1, _ := a.Check(cmd, av, nil)
		d2, _ := b.Check(cmd, av, nil)
		if d1 != d2 {
			t.Fatalf("%q and its String() %q decide %q differently: %v, %v", rules, a.String(), call, d1, d2)
		}
		if d1 == Allowed && !a.allKeys && len(a.keys) == 0 && cmd != nil && len(cmd.Keys(av, nil)) > 0 && cmd.Flags&commands.NoAuth == 0 {
			t.Fatalf("%q allowed %q, which has keys, without any key pattern", rules, call)
		}
	})
}

// FuzzAuthenticate checks that only the configured password logs a user in,
// whatever bytes arrive as user name and password (AUTH's and HELLO AUTH's
// arguments come straight from the client).
func FuzzAuthenticate(f *testing.F) {
	us, err := New([]UserConfig{{Name: "app", PasswordSHA256: HashPassword("s3cret"), ACL: "+@all"}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("app"), []byte("s3cret"))
	f.Add([]byte("app"), []byte("s3cret\x00"))
	f.Add([]byte("default"), []byte(""))
	f.Fuzz(func(t *testing.T, user, pass []byte) {
		u := us.Authenticate(user, pass)
		right := string(user) == "app" && string(pass) == "s3cret"
		if (u != nil) != right {
			t.Fatalf("Authenticate(%q, %q) = %v", user, pass, u)
		}
	})
}
