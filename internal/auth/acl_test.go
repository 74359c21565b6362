package auth

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
)

func args(s string) [][]byte {
	var out [][]byte
	for _, f := range strings.Fields(s) {
		out = append(out, []byte(f))
	}
	return out
}

func mustACL(t *testing.T, rules string) *ACL {
	t.Helper()
	a, err := ParseACL(rules, nil)
	if err != nil {
		t.Fatalf("ParseACL(%q): %v", rules, err)
	}
	return a
}

func check(a *ACL, call string) Denial {
	av := args(call)
	d, _ := a.Check(commands.Builtin().Lookup(av), av, nil)
	return d
}

func TestACLCommandRules(t *testing.T) {
	cases := []struct {
		rules string
		call  string
		want  Denial
	}{
		{"", "get k", DeniedCmd},
		{"allkeys", "get k", DeniedCmd},
		{"+@all allkeys", "set k v", Allowed},
		{"allcommands allkeys", "flushall", Allowed},
		{"allcommands nocommands allkeys", "get k", DeniedCmd},
		{"+@read allkeys", "get k", Allowed},
		{"+@read allkeys", "set k v", DeniedCmd},
		{"+@read allkeys", "eval x 0", DeniedCmd},
		{"+@all -@dangerous allkeys", "flushall", DeniedCmd},
		{"+@all -@dangerous allkeys", "keys *", DeniedCmd},
		{"+@all -@dangerous allkeys", "get k", Allowed},
		{"+@all -set allkeys", "set k v", DeniedCmd},
		{"+@all -set +set allkeys", "set k v", Allowed},
		{"-@all +get allkeys", "get k", Allowed},
		{"-@all +get allkeys", "mget k", DeniedCmd},
		{"+@read -get allkeys", "get k", DeniedCmd},
		{"-get +@read allkeys", "get k", Allowed},          // later rule wins
		{"+@string -@write allkeys", "set k v", DeniedCmd}, // data-type categories
		{"+@string -@write allkeys", "strlen k", Allowed},
		{"+@hash allkeys", "hget h f", Allowed},
		{"+@hash allkeys", "get k", DeniedCmd},
		{"+@sortedset allkeys", "zrange z 0 -1", Allowed},
		{"+@stream allkeys", "xlen s", Allowed},
		// Subcommands: a container rule covers every subcommand; a
		// subcommand rule only itself.
		{"+client", "client kill 1.2.3.4:5", Allowed},
		{"+@all -client allkeys", "client setname x", DeniedCmd},
		{"+@all -client|kill allkeys", "client kill 1.2.3.4:5", DeniedCmd},
		{"+@all -client|kill allkeys", "client setname x", Allowed},
		{"-@all +config|get", "config get maxmemory", Allowed},
		{"-@all +config|get", "config set maxmemory 1", DeniedCmd},
		{"+@all -@admin", "config get maxmemory", DeniedCmd},
		// AUTH, HELLO, QUIT and RESET carry no_auth and are never refused.
		{"", "auth u p", Allowed},
		{"nocommands", "hello 3", Allowed},
		{"-@all -auth", "auth p", Allowed},
		{"", "quit", Allowed},
		{"", "reset", Allowed},
		// Unknown commands: only @all names them, and only with every key
		// (their keys cannot be found).
		{"+@all allkeys", "nosuchcommand x", Allowed},
		{"+@all ~*", "nosuchcommand x", Allowed},
		{"+@all", "nosuchcommand x", DeniedKey},
		{"+@all ~cache:*", "nosuchcommand cache:x", DeniedKey},
		{"+@read +@write allkeys", "nosuchcommand x", DeniedCmd},
	}
	for _, c := range cases {
		a := mustACL(t, c.rules)
		if got := check(a, c.call); got != c.want {
			t.Errorf("%q: %q = %v, want %v", c.rules, c.call, got, c.want)
		}
	}
}

func TestACLKeyRules(t *testing.T) {
	cases := []struct {
		rules string
		call  string
		want  Denial
	}{
		{"+@all ~cache:*", "get cache:a", Allowed},
		{"+@all ~cache:*", "get session:a", DeniedKey},
		{"+@all ~cache:*", "mget cache:a session:a", DeniedKey},
		{"+@all ~cache:* ~session:*", "mget cache:a session:a", Allowed},
		{"+@all", "get k", DeniedKey}, // no pattern: no key
		{"+@all", "ping", Allowed},    // no key: no key check
		{"+@all ~*", "get anything", Allowed},
		{"+@all ~cache:* resetkeys", "get cache:a", DeniedKey},
		{"+@all ~x resetkeys allkeys", "get y", Allowed},
		// Read/write patterns: the key spec's flags decide what is needed.
		{"+@all %R~cache:*", "get cache:a", Allowed},
		{"+@all %R~cache:*", "set cache:a v", DeniedKey},
		{"+@all %W~cache:*", "set cache:a v", Allowed},
		{"+@all %W~cache:*", "get cache:a", DeniedKey},
		{"+@all %W~cache:*", "set cache:a v get", DeniedKey}, // SET ... GET reads
		{"+@all %R~cache:*", "bitfield cache:a get u8 0", Allowed},
		{"+@all %R~cache:*", "bitfield cache:a get u8 0 set u8 0 1", DeniedKey},
		{"+@all %W~cache:*", "incr cache:a", DeniedKey}, // RW: read and write
		{"+@all %RW~cache:*", "incr cache:a", Allowed},
		{"+@all %R~src:* %W~dst:*", "copy src:a dst:b", Allowed},
		{"+@all %R~src:* %W~dst:*", "copy dst:b src:a", DeniedKey},
		{"+@all %R~*", "exists k", Allowed}, // EXISTS needs no permission, just a pattern
		{"+@all %W~*", "exists k", Allowed},
		{"+@all %R~a*", "exists k", DeniedKey},
		{"+@all %R~a* %W~b*", "del a1", DeniedKey},
		{"+@all %R~a* %W~b*", "del b1", Allowed},
		// Scripts: the declared keys are read-write.
		{"+@all ~cache:*", "eval s 1 cache:a", Allowed},
		{"+@all ~cache:*", "eval s 2 cache:a session:a", DeniedKey},
		{"+@all ~cache:*", "eval s 0 session:a", Allowed}, // ARGV, not a key
		{"+@all %R~*", "eval s 1 k", DeniedKey},
		{"+@all ~cache:*", "fcall f 1 session:x", DeniedKey},
		{"+@all ~cache:*", "evalsha abc 1 session:x", DeniedKey},
		// SORT ... STORE: the destination is written.
		{"+@all ~cache:*", "sort cache:l store session:x", DeniedKey},
		{"+@all ~cache:*", "sort cache:l store cache:x", Allowed},
		{"+@all %R~cache:*", "sort cache:l store cache:x", DeniedKey},
		{"+@all %R~cache:* %W~out:*", "sort cache:l by nosort store out:x", Allowed},
		// SORT's BY patterns and GET read keys no argument names: the
		// first of them in Redis's option order, after the sorted key.
		{"+@all ~cache:*", "sort cache:l by cache:w_*", DeniedSortBy},
		{"+@all ~cache:*", "sort cache:l get # by cache:w_*", DeniedSortGet},
		{"+@all ~cache:*", "sort_ro cache:l limit 0 1 by cache:w_*", DeniedSortBy},
		{"+@all ~cache:*", "sort session:l by cache:w_*", DeniedKey},
		{"+@all ~cache:*", "sort cache:l nosuch get #", Allowed},     // Redis's syntax error first
		{"+@all ~cache:*", "sort cache:l limit 0 x get #", Allowed},  // Redis's "not an integer" first
		{"+@all ~cache:*", "sort_ro cache:l store x get #", Allowed}, // no STORE for SORT_RO
		{"+@all %R~*", "sort l by w_* get #", Allowed},
		// Glob syntax is Redis's.
		{"+@all ~user:[ab]?", "get user:a1", Allowed},
		{"+@all ~user:[ab]?", "get user:c1", DeniedKey},
		// Commands whose "keys" are not keys (shard channels).
		{"+@all allchannels", "spublish ch msg", Allowed},
	}
	for _, c := range cases {
		a := mustACL(t, c.rules)
		if got := check(a, c.call); got != c.want {
			t.Errorf("%q: %q = %v, want %v", c.rules, c.call, got, c.want)
		}
	}
}

func TestACLParseErrors(t *testing.T) {
	for _, r := range []string{
		"+nosuchcmd",
		"-@nosuchcategory",
		"+client|nosuchsub",
		"+get|x",
		"+",
		"~",
		"%X~a",
		"%~a",
		"%Ra",
		"~[abc",
		">secret",
		"#0123",
		"on",
		"nopass",
		"&",
		"&[abc",
		"allchannels &news",
		"&* &news",
		"(~x +get)",
		"whatever",
	} {
		_, err := ParseACL(r, nil)
		if !errors.Is(err, ErrBadACL) {
			t.Errorf("ParseACL(%q) = %v, want ErrBadACL", r, err)
		}
		if err != nil && r == ">secret" && strings.Contains(err.Error(), "secret") {
			t.Errorf("error quotes the password: %v", err)
		}
	}
	if _, err := ParseACL(strings.Repeat("+get ", maxACLLen), nil); !errors.Is(err, ErrBadACL) {
		t.Errorf("oversized ACL accepted: %v", err)
	}
}

func TestACLCaseInsensitive(t *testing.T) {
	a := mustACL(t, "+GET +@Read %r~CACHE:*")
	if check(a, "GET CACHE:x") != Allowed {
		t.Error("upper-case rules should match like Redis's")
	}
	if check(a, "get cache:x") != DeniedKey {
		t.Error("key patterns are case-sensitive, as in Redis")
	}
}

func TestNoPermError(t *testing.T) {
	tab := commands.Builtin()
	if got := NoPermError("app", tab.Get("set"), "", DeniedCmd); got != "NOPERM User app has no permissions to run the 'set' command" {
		t.Errorf("got %q", got)
	}
	if got := NoPermError("app", tab.Get("client|kill"), "", DeniedCmd); got != "NOPERM User app has no permissions to run the 'client|kill' command" {
		t.Errorf("got %q", got)
	}
	if got := NoPermError("app", nil, "FOO\r\n", DeniedCmd); strings.ContainsAny(got, "\r\n") {
		t.Errorf("control characters reach the error: %q", got)
	}
	if got := NoPermError("app", nil, "", DeniedKey); got != "NOPERM No permissions to access a key" {
		t.Errorf("got %q", got)
	}
}

func TestKeyRefsMatchKeys(t *testing.T) {
	// KeyRefs must find the same keys as Keys for every command (the ACL
	// and the policy must agree on what a key is).
	tab := commands.Builtin()
	for _, call := range []string{
		"set k v", "mset a 1 b 2", "eval s 2 a b c", "sort l by w get # store d", "migrate h 1 \"\" 0 5 keys a b",
		"xread count 1 streams s1 s2 0 0", "zunionstore d 2 a b", "georadius g 0 0 1 km store d", "lmpop 2 a b left",
	} {
		av := args(call)
		c := tab.Lookup(av)
		keys := c.Keys(av, nil)
		refs := c.KeyRefs(av, nil)
		if len(keys) != len(refs) {
			t.Errorf("%q: Keys %v, KeyRefs %v", call, keys, refs)
			continue
		}
		for i := range keys {
			if keys[i] != refs[i].Index {
				t.Errorf("%q: Keys %v, KeyRefs %v", call, keys, refs)
			}
		}
	}
}

func TestUsersValidate(t *testing.T) {
	ok := HashPassword("pw")
	err := Validate([]UserConfig{
		{Name: "a", PasswordSHA256: ok, ACL: "+@all"},
		{Name: "a", PasswordSHA256: ok},
		{Name: "", PasswordSHA256: ok},
		{Name: "b", Password: "hunter2", PasswordSHA256: ok},
		{Name: "c", PasswordSHA256: "xyz"},
		{Name: "d", PasswordSHA256: ok, ACL: "+nosuch"},
		{Name: "e", PasswordSHA256: ok, UpstreamPasswordFile: "/x"},
	}, nil)
	if err == nil {
		t.Fatal("expected errors")
	}
	msg := err.Error()
	for _, want := range []string{"users[1].name", "users[2].name", "users[3].password:", "users[4].password_sha256", "users[5].acl", "users[6].upstream_password_file"} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in %s", want, msg)
		}
	}
	if strings.Contains(msg, "hunter2") {
		t.Errorf("an error quotes a plaintext password: %s", msg)
	}
	if strings.Contains(msg, "users[0]") {
		t.Errorf("a valid user was reported: %s", msg)
	}
}

func TestAuthenticate(t *testing.T) {
	off := false
	us, err := New([]UserConfig{
		{Name: "app", PasswordSHA256: HashPassword("s3cret"), ACL: "+@read ~*"},
		{Name: "old", PasswordSHA256: strings.ToUpper(HashPassword("pw")), Enabled: &off},
		{Name: "default", PasswordSHA256: HashPassword("dflt")},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if u := us.Authenticate([]byte("app"), []byte("s3cret")); u == nil || u.Name != "app" {
		t.Errorf("right password refused: %v", u)
	}
	for _, c := range [][2]string{{"app", "wrong"}, {"app", ""}, {"nobody", "s3cret"}, {"old", "pw"}, {"", ""}, {"APP", "s3cret"}} {
		if u := us.Authenticate([]byte(c[0]), []byte(c[1])); u != nil {
			t.Errorf("Authenticate(%q, %q) = %v, want nil", c[0], c[1], u.Name)
		}
	}
	if u := us.Authenticate([]byte("default"), []byte("dflt")); u == nil {
		t.Error("the default user, when configured, authenticates")
	}
}

func TestUpstreamPasswordFile(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/pw"
	if err := writeFile(f, "up-secret\n"); err != nil {
		t.Fatal(err)
	}
	us, err := New([]UserConfig{{Name: "a", PasswordSHA256: HashPassword("x"), UpstreamUser: "redis-a", UpstreamPasswordFile: f}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := us.Get("a").Upstream; c.User != "redis-a" || c.Password != "up-secret" {
		t.Errorf("credential %q / %q", c.User, c.Password)
	}
	if s := us.Get("a").Upstream.String(); strings.Contains(s, "up-secret") {
		t.Errorf("credential prints its password: %s", s)
	}
	if _, err := New([]UserConfig{{Name: "a", PasswordSHA256: HashPassword("x"), UpstreamUser: "r", UpstreamPasswordFile: dir + "/missing"}}, nil); err == nil {
		t.Error("a missing password file should fail")
	}
}

func TestFailLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewFailLimiter()
	l.SetClock(func() time.Time { return now })
	const burst = DefaultFailBurst
	for i := 0; i < burst; i++ {
		if !l.Allowed("1.2.3.4", burst) {
			t.Fatalf("refused after %d failures", i)
		}
		l.Failed("1.2.3.4", burst)
	}
	if l.Allowed("1.2.3.4", burst) {
		t.Fatal("allowed past the burst")
	}
	if !l.Allowed("5.6.7.8", burst) {
		t.Fatal("another address is limited too")
	}
	now = now.Add(time.Second)
	if !l.Allowed("1.2.3.4", burst) {
		t.Fatal("not refilled after a second")
	}
	l.Failed("1.2.3.4", burst)
	if l.Allowed("1.2.3.4", burst) {
		t.Fatal("one refill allows one attempt")
	}
	// A smaller burst (a reload) caps a bucket filled under the larger.
	now = now.Add(time.Hour)
	if !l.Allowed("1.2.3.4", 2) {
		t.Fatal("refused after an hour")
	}
	l.Failed("1.2.3.4", 2)
	l.Failed("1.2.3.4", 2)
	if l.Allowed("1.2.3.4", 2) {
		t.Fatal("a bucket refilled for an hour allowed more than the new burst of 2")
	}
	// Memory stays bounded under an address spray.
	l.MaxAddrs = 100
	for i := 0; i < 1000; i++ {
		l.Failed(string(rune('a'+i%26))+time.Duration(i).String(), burst)
	}
	if n := l.Tracked(); n > 100 {
		t.Fatalf("%d addresses tracked, cap 100", n)
	}
}

// Channel rules as Redis 7 applies them: a user without any may use no
// channel; PUBLISH and (S)SUBSCRIBE channels match a pattern; PSUBSCRIBE
// patterns must be one of the user's patterns as written; unsubscribing is
// always allowed.
func TestACLChannelRules(t *testing.T) {
	cases := []struct {
		rules string
		call  string
		want  Denial
	}{
		{"+@all ~*", "PUBLISH news 1", DeniedChannel}, // resetchannels by default
		{"+@all ~*", "SUBSCRIBE news", DeniedChannel},
		{"+@all ~*", "UNSUBSCRIBE news", Allowed},
		{"+@all ~*", "PUNSUBSCRIBE news*", Allowed},
		{"+@all ~* allchannels", "PSUBSCRIBE *", Allowed},
		{"+@all ~* &*", "SPUBLISH anything 1", Allowed},
		{"+@all &news.*", "PUBLISH news.eu 1", Allowed},
		{"+@all &news.*", "PUBLISH sport 1", DeniedChannel},
		{"+@all &news.*", "SUBSCRIBE news.eu news.us", Allowed},
		{"+@all &news.*", "SUBSCRIBE news.eu sport", DeniedChannel},
		{"+@all &news.*", "SSUBSCRIBE sport", DeniedChannel},
		{"+@all &news.*", "PSUBSCRIBE news.*", Allowed},
		{"+@all &news.*", "PSUBSCRIBE news.eu", DeniedChannel}, // narrower, but not one of the patterns
		{"+@all &news.*", "PSUBSCRIBE news.* *", DeniedChannel},
		{"+@all allchannels resetchannels &a", "PUBLISH b 1", DeniedChannel},
		{"+@all &a resetchannels", "PUBLISH a 1", DeniedChannel},
		{"+@all &news.*", "GET news.eu", DeniedKey}, // channels are not keys
		{"-publish &*", "PUBLISH a 1", DeniedCmd},   // the command rule first, as in Redis
	}
	for _, c := range cases {
		if got := check(mustACL(t, c.rules), c.call); got != c.want {
			t.Errorf("rules %q, %s: %v, want %v", c.rules, c.call, got, c.want)
		}
	}
	if got := NoPermError("u", nil, "publish", DeniedChannel); got != "NOPERM No permissions to access a channel" {
		t.Errorf("NoPermError = %q", got)
	}
}

// ScriptsBeyondRules names exactly the users whose scripts can run what
// their rules deny: scripting allowed, some command denied, and no
// upstream_user of their own for Redis's ACL to check the script's calls.
func TestScriptsBeyondRules(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/pw"
	if err := writeFile(f, "pw"); err != nil {
		t.Fatal(err)
	}
	u := func(name, acl string) UserConfig {
		return UserConfig{Name: name, PasswordSHA256: HashPassword("x"), ACL: acl}
	}
	own := u("own", "+@all -@dangerous ~*")
	own.UpstreamUser, own.UpstreamPasswordFile = "redis-own", f
	table := commands.Builtin()
	us, err := New([]UserConfig{
		u("everything", "+@all ~*"),
		u("no-dangerous", "+@all -@dangerous ~*"),
		u("no-config-set", "+@all -config|set ~*"),
		u("reader", "+@read ~*"),
		u("fcall-only", "+@read +fcall ~*"),
		u("no-scripts", "+@all -@scripting ~*"),
		own,
	}, table)
	if err != nil {
		t.Fatal(err)
	}
	got := us.ScriptsBeyondRules(table)
	if want := []string{"no-dangerous", "no-config-set", "fcall-only"}; !slices.Equal(got, want) {
		t.Fatalf("ScriptsBeyondRules = %v, want %v", got, want)
	}
}
