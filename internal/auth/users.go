package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/namespace"
)

// UserConfig is one [[users]] entry of the configuration file.
type UserConfig struct {
	Name string `toml:"name"`
	// PasswordSHA256 is the hex SHA-256 of the password, as Redis's ACL
	// stores it (ACL SETUSER ... #<hash>).
	PasswordSHA256 string `toml:"password_sha256"`
	// Password is only decoded to be refused: a plaintext password does
	// not belong in a configuration file.
	Password string `toml:"password"`
	// Enabled defaults to true; a disabled user cannot authenticate.
	Enabled *bool  `toml:"enabled"`
	ACL     string `toml:"acl"`
	// UpstreamUser and UpstreamPasswordFile are the Redis credential this
	// user's traffic runs with; empty: the [upstream] credential.
	UpstreamUser         string `toml:"upstream_user"`
	UpstreamPasswordFile string `toml:"upstream_password_file"`
	// Scope names the [[policy.scope]] that applies to this user.
	Scope string `toml:"scope"`
	// MaxConnections caps the connections authenticated as this user at
	// once; 0 is no limit.
	MaxConnections int `toml:"max_connections"`
	// Namespace is the key prefix this user's commands are confined to
	// (internal/namespace); empty: none, or the listener's.
	Namespace string `toml:"namespace"`
}

// Error is one problem with a [[users]] entry; Key is dotted
// ("users[1].acl") so the config loader can point at the line.
type Error struct {
	Key, Msg string
}

func (e *Error) Error() string { return e.Key + ": " + e.Msg }

// Validate checks the entries without reading any file. Messages never
// quote a password.
func Validate(users []UserConfig, table *commands.Table) error {
	var errs []error
	seen := map[string]bool{}
	for i, u := range users {
		key := fmt.Sprintf("users[%d]", i)
		bad := func(field, msg string) { errs = append(errs, &Error{Key: key + field, Msg: msg}) }
		switch {
		case u.Name == "":
			bad(".name", "a user needs a name")
		case strings.ContainsAny(u.Name, " \t\r\n"):
			bad(".name", "a user name cannot contain spaces or newlines")
		case seen[u.Name]:
			bad(".name", fmt.Sprintf("user %q is defined twice", u.Name))
		}
		seen[u.Name] = true
		if u.Password != "" {
			bad(".password", "plaintext passwords are refused in the configuration file; set password_sha256 to the hex SHA-256 of the password instead (for example: printf %s 'the-password' | sha256sum)")
		}
		if _, err := decodeHash(u.PasswordSHA256); err != nil {
			bad(".password_sha256", err.Error())
		}
		if _, err := ParseACL(u.ACL, table); err != nil {
			bad(".acl", err.Error())
		}
		if u.Namespace != "" {
			if _, err := namespace.New(u.Namespace); err != nil {
				bad(".namespace", err.Error())
			}
		}
		if u.MaxConnections < 0 {
			bad(".max_connections", "must be 0 (no limit) or more")
		}
		if u.UpstreamPasswordFile != "" && u.UpstreamUser == "" {
			bad(".upstream_password_file", "set upstream_user too: the password file is that Redis user's password")
		}
	}
	return errors.Join(errs...)
}

func decodeHash(h string) ([32]byte, error) {
	var out [32]byte
	if h == "" {
		return out, errors.New("missing: set the hex SHA-256 of the user's password")
	}
	b, err := hex.DecodeString(strings.ToLower(h))
	if err != nil || len(b) != sha256.Size {
		return out, errors.New("not a hex SHA-256 (64 hex digits)")
	}
	copy(out[:], b)
	return out, nil
}

// Credential is an upstream (Redis) user and password. The zero value
// means the [upstream] section's credential.
type Credential struct {
	User, Password string
}

// String names the credential without its password, for logs.
func (c Credential) String() string {
	if c.User == "" {
		return "(upstream default)"
	}
	return c.User
}

// User is one configured proxy user.
type User struct {
	Name     string
	hash     [32]byte
	Enabled  bool
	ACL      *ACL
	Upstream Credential
	Scope    string
	// MaxConnections is max_connections: 0 is no limit.
	MaxConnections int
	// Namespace is the key prefix the user is confined to; "": none.
	Namespace string
	conns     atomic.Int64 // connections authenticated as this user
}

// Acquire counts one more connection authenticated as u, unless u is at
// its max_connections; it reports whether it did.
func (u *User) Acquire() bool {
	if u.MaxConnections <= 0 {
		u.conns.Add(1)
		return true
	}
	for {
		n := u.conns.Load()
		if n >= int64(u.MaxConnections) {
			return false
		}
		if u.conns.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives back a connection Acquire counted.
func (u *User) Release() { u.conns.Add(-1) }

// Connections is the number of connections authenticated as u.
func (u *User) Connections() int64 { return u.conns.Load() }

// Users is the configured user set. It is immutable and safe for
// concurrent use.
type Users struct {
	byName map[string]*User
	list   []*User
}

// New builds the user set, reading each upstream password file. It
// validates first, so it can be called on an unvalidated list.
func New(cfg []UserConfig, table *commands.Table) (*Users, error) {
	if err := Validate(cfg, table); err != nil {
		return nil, err
	}
	us := &Users{byName: make(map[string]*User, len(cfg))}
	for i, c := range cfg {
		acl, _ := ParseACL(c.ACL, table)
		hash, _ := decodeHash(c.PasswordSHA256)
		u := &User{Name: c.Name, hash: hash, Enabled: c.Enabled == nil || *c.Enabled, ACL: acl, Scope: c.Scope, MaxConnections: c.MaxConnections, Namespace: c.Namespace}
		if c.UpstreamUser != "" {
			u.Upstream.User = c.UpstreamUser
			if c.UpstreamPasswordFile != "" {
				pass, err := readPasswordFile(c.UpstreamPasswordFile)
				if err != nil {
					return nil, &Error{Key: fmt.Sprintf("users[%d].upstream_password_file", i), Msg: err.Error()}
				}
				u.Upstream.Password = pass
			}
		}
		us.byName[u.Name] = u
		us.list = append(us.list, u)
	}
	return us, nil
}

func readPasswordFile(name string) (string, error) {
	b, err := os.ReadFile(name)
	return strings.TrimRight(string(b), "\r\n"), err
}

// RotatedPasswords checks the upstream password files of cfg, a
// configuration about to be reloaded, against the passwords us read at
// start: an error for each file that no longer holds its user's password
// or cannot be read. A reload cannot apply a rotated password (a user's
// upstream connections are set up at start) and must not report success
// as if it had: it was silently ignored, and the user's commands failed
// with WRONGPASS once Redis dropped the old password (found by review).
func (us *Users) RotatedPasswords(cfg []UserConfig) []error {
	var errs []error
	for i, c := range cfg {
		u := us.Get(c.Name)
		if c.UpstreamPasswordFile == "" || u == nil || u.Upstream.User != c.UpstreamUser {
			continue // not the same user: a change of [[users]] itself
		}
		key := fmt.Sprintf("users[%d].upstream_password_file", i)
		pass, err := readPasswordFile(c.UpstreamPasswordFile)
		switch {
		case err != nil:
			errs = append(errs, &Error{Key: key, Msg: err.Error()})
		case pass != u.Upstream.Password:
			errs = append(errs, &Error{Key: key, Msg: "the file holds another password than the one read at start; a user's upstream credential is set up at start"})
		}
	}
	return errs
}

// scriptCommands run code that calls Redis commands itself.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// ScriptsBeyondRules names the users whose scripts run commands their
// command rules deny: users on the proxy's own upstream credential (no
// upstream_user) whose acl allows a scripting command and denies some
// other command. The proxy checks the script call itself and its declared
// keys; the commands the script calls reach Redis under the upstream
// credential, whose Redis ACL is all that applies inside it (Redis checks
// them against the caller's: found by review, EVAL "return
// redis.call('flushall')" ran for a user with -@dangerous). With an
// upstream_user holding the same rules in Redis's ACL, Redis refuses them
// as it would to the user directly.
func (us *Users) ScriptsBeyondRules(table *commands.Table) []string {
	var names []string
	for _, u := range us.List() {
		scripts := slices.ContainsFunc(scriptCommands, func(n string) bool {
			c := table.Get(n)
			return c != nil && u.ACL.CommandAllowed(c)
		})
		if u.Upstream.User == "" && scripts && deniesSome(u.ACL, table) {
			names = append(names, u.Name)
		}
	}
	return names
}

// deniesSome reports whether acl denies a command or subcommand of table.
func deniesSome(acl *ACL, table *commands.Table) bool {
	for _, c := range table.Commands() {
		if !acl.CommandAllowed(c) {
			return true
		}
		for _, s := range c.Subcommands {
			if !acl.CommandAllowed(s) {
				return true
			}
		}
	}
	return false
}

// Len returns the number of users; a nil set has none.
func (us *Users) Len() int {
	if us == nil {
		return 0
	}
	return len(us.list)
}

// List returns the users in configuration order.
func (us *Users) List() []*User {
	if us == nil {
		return nil
	}
	return us.list
}

// Get returns the user called name, or nil.
func (us *Users) Get(name string) *User {
	if us == nil {
		return nil
	}
	return us.byName[name]
}

// absent is compared against when the user does not exist, so that a
// wrong user name costs what a wrong password does.
var absent = sha256.Sum256([]byte("redproxy: no such user"))

// Authenticate returns the user if name exists, is enabled and pass is its
// password. The password's hash is compared in constant time, and a
// missing user costs the same comparison, so neither the reply nor its
// timing says whether the user exists.
func (us *Users) Authenticate(name, pass []byte) *User {
	sum := sha256.Sum256(pass)
	u := us.Get(string(name))
	want := absent
	if u != nil {
		want = u.hash
	}
	match := subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	if u == nil || !match || !u.Enabled {
		return nil
	}
	return u
}

// HashPassword returns the hex SHA-256 of a password, the form
// password_sha256 takes.
func HashPassword(pass string) string {
	sum := sha256.Sum256([]byte(pass))
	return hex.EncodeToString(sum[:])
}
