// Package config loads redproxy's TOML configuration.
//
// A *Config is an immutable snapshot: Load, Parse and Default return a fresh
// value that callers read but never modify, so it can be shared between
// goroutines without locks. Changing settings (e.g. command-line overrides via
// Apply) produces a new snapshot.
//
// Every error names the file, the line when known and the dotted key, so an
// operator can fix a bad config without reading Go code. Unknown keys are
// errors because a misspelt setting would otherwise be silently ignored.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/stampede"
)

// Config is the whole proxy configuration. See config.example.toml at the
// repository root for what each setting means.
type Config struct {
	Server   Server   `toml:"server"`
	Upstream Upstream `toml:"upstream"`
	// Policy is the guard's rules; package policy documents and checks them.
	Policy policy.Config `toml:"policy"`
	// Stampede is coalescing, miss holds and early refresh; package
	// stampede documents and checks it.
	Stampede stampede.Config `toml:"stampede"`
	// LocalCache is the local tier; package localcache documents its
	// contract and checks the section.
	LocalCache localcache.Config `toml:"localcache"`
	// Users are the proxy's own users ([[users]]); package auth documents
	// and checks them. With none, clients authenticate with the upstream
	// password, if there is one (the requirepass-style mode).
	Users []auth.UserConfig `toml:"users"`
	// Admin protects the admin HTTP endpoint ([admin]).
	Admin Admin `toml:"admin"`
	// Mirror sends a copy of the traffic to one of Upstreams ([mirror]);
	// package mirror documents and checks it, mirror.go here checks the
	// upstream it names.
	Mirror mirror.Config `toml:"mirror"`

	// Upstreams are the named upstreams ([upstreams.NAME]), each set up
	// like [upstream]; routes (routes.go) send keys and channels to them,
	// [mirror] a copy of the traffic.
	Upstreams map[string]Upstream `toml:"upstreams"`
	// Routes ([[route]]) send the keys matching a pattern to a named
	// upstream, first match first; keys matching none go to [upstream].
	Routes []Route `toml:"route"`
	// ChannelRoutes ([[channel_route]]) do the same for pub/sub channels.
	ChannelRoutes []Route `toml:"channel_route"`

	// Sections owned by other packages ([localcache]) are added
	// here as fields whose types live in those packages, together with their
	// defaults in Default and their checks in Validate. Until a field exists,
	// its section is rejected as unknown.
}

// Server configures the client-facing side of the proxy.
type Server struct {
	Listen            string         `toml:"listen"`
	Admin             string         `toml:"admin"` // "" disables the admin HTTP server
	LogLevel          string         `toml:"log_level"`
	LogFormat         string         `toml:"log_format"`
	MaxClients        int            `toml:"max_clients"`
	MaxRequestBytes   units.ByteSize `toml:"max_request_bytes"`
	MaxBulkBytes      units.ByteSize `toml:"max_bulk_bytes"`
	MaxArgs           int            `toml:"max_args"`
	MaxInlineBytes    units.ByteSize `toml:"max_inline_bytes"`
	ClientOutputLimit units.ByteSize `toml:"client_output_limit"`
	PubSubOutputLimit units.ByteSize `toml:"pubsub_output_limit"`
	// PubSubOutputSoftLimit and PubSubOutputSoftTime: a subscriber whose
	// unsent messages stay above the soft limit for the soft time is
	// closed, as by Redis's client-output-buffer-limit pubsub soft limit;
	// a soft limit of 0 turns it off.
	PubSubOutputSoftLimit units.ByteSize `toml:"pubsub_output_soft_limit"`
	PubSubOutputSoftTime  units.Duration `toml:"pubsub_output_soft_time"`
	IdleTimeout           units.Duration `toml:"idle_timeout"` // 0 = never close idle clients
	// IdleParkAfter: a plain client idle this long gives up its goroutine
	// and buffers until it sends again (internal/idlepark); 0 never parks.
	IdleParkAfter   units.Duration `toml:"idle_park_after"`
	ShutdownTimeout units.Duration `toml:"shutdown_timeout"`
	// SlowlogThreshold: batches that take at least this long are entered
	// in the slow log (/debug/slowlog); SlowlogMaxLen entries are kept, 0
	// turns the slow log off.
	SlowlogThreshold units.Duration `toml:"slowlog_threshold"`
	SlowlogMaxLen    int            `toml:"slowlog_max_len"`

	// ClientWriteTimeout closes a client that takes none of its replies
	// for this long; 0 waits forever.
	ClientWriteTimeout units.Duration `toml:"client_write_timeout"`

	// TLS is the TLS listener (tls.go).
	TLS ServerTLS `toml:"tls"`

	// Listeners are client listeners beside listen and tls.listen
	// ([[server.listeners]], listeners.go), each with a name.
	Listeners []Listener `toml:"listeners"`

	// AllowUnauthenticated lets a listener that is not loopback start with
	// neither [[users]] nor an upstream password, so anyone who reaches it
	// gets in. Off by default: that is almost always a mistake.
	AllowUnauthenticated bool `toml:"allow_unauthenticated"`

	// ProxyProtocol makes the client listeners (listen, tls.listen, and
	// each [[server.listeners]] entry that does not set its own) expect a PROXY protocol header, version 1 or 2, first on every
	// connection, as a load balancer sends it; the address in it is the
	// client's. A connection without one is closed.
	ProxyProtocol bool `toml:"proxy_protocol"`

	// AuthFailureLimit is how many failed AUTHs a client address may make
	// at once before it may try only once a second (a bucket of that many,
	// refilled at one a second; a right AUTH gives none back); 0 turns the
	// limit off. AuthLimitExempt lists addresses and CIDR prefixes it never
	// applies to: behind a sidecar or a local balancer every client has
	// the same address, and one client with a wrong password would lock
	// out the others' right ones.
	AuthFailureLimit int      `toml:"auth_failure_limit"`
	AuthLimitExempt  []string `toml:"auth_limit_exempt"`
}

// AuthLimited reports whether the failed-AUTH limit applies to a client at
// host (an IP address, as the connection or its PROXY header gives it).
// The exemptions were checked by Validate.
func (s *Server) AuthLimited(host string) bool {
	if s.AuthFailureLimit == 0 {
		return false
	}
	if len(s.AuthLimitExempt) == 0 {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return true
	}
	// A zone ("fe80::1%eth0") never matches a prefix, and a v4-mapped
	// client is compared as the IPv4 address it is (parsePrefix unmaps
	// the prefixes too).
	ip = ip.Unmap().WithZone("")
	for _, e := range s.AuthLimitExempt {
		if p, err := parsePrefix(e); err == nil && p.Contains(ip) {
			return false
		}
	}
	return true
}

// parsePrefix reads an address ("10.0.0.5", "::1") as the prefix of that
// one address, or a CIDR prefix ("127.0.0.0/8").
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		if a := p.Addr(); a.Is4In6() {
			// "::ffff:10.0.0.0/104" is 10.0.0.0/8: clients are unmapped.
			if p.Bits() < 96 {
				return netip.Prefix{}, fmt.Errorf("%q: a v4-mapped prefix must be at least /96", s)
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	ip = ip.Unmap().WithZone("")
	return netip.PrefixFrom(ip, ip.BitLen()), nil
}

// Admin configures access to the admin HTTP endpoint.
type Admin struct {
	// TokenFile holds the bearer token the admin endpoint requires for
	// everything but /healthz and /readyz. Required when server.admin is
	// not a loopback address; on loopback, a token is required only if set.
	TokenFile string `toml:"token_file"`
}

// Upstream configures the connections to the real Redis.
type Upstream struct {
	// Mode says how the upstream is found: ModeStandalone dials Address;
	// ModeSentinel asks Sentinels for MasterName's primary and follows its
	// failovers (Address is then not used).
	Mode    string `toml:"mode"`
	Address string `toml:"address"` // host:port, or EmbeddedAddress
	// Sentinels, MasterName and the Sentinel credentials are used in
	// ModeSentinel only; the Sentinel credentials are those of the
	// Sentinel processes, which need not be Redis's.
	Sentinels        []string `toml:"sentinels"`
	MasterName       string   `toml:"master_name"`
	SentinelUsername string   `toml:"sentinel_username"`
	SentinelPassword string   `toml:"sentinel_password"`

	// Seeds are some nodes of the cluster in ModeCluster (Address is
	// then not used either).
	Seeds        []string       `toml:"seeds"`
	Username     string         `toml:"username"`
	Password     string         `toml:"password"`
	Connections  int            `toml:"connections"`
	MaxPinned    int            `toml:"max_pinned"`
	DialTimeout  units.Duration `toml:"dial_timeout"`
	ReplyTimeout units.Duration `toml:"reply_timeout"`
	DeadTimeout  units.Duration `toml:"dead_timeout"`
	ReconnectMin units.Duration `toml:"reconnect_min"`
	ReconnectMax units.Duration `toml:"reconnect_max"`
	Databases    int            `toml:"databases"`
	// ReadFrom, MaxReplicaLag and ReplicaPollInterval send read-only
	// commands to the primary's replicas (proxy/replicas.go; README
	// "Replica reads"); checked by checkReplicaReads.
	ReadFrom            string         `toml:"read_from"`
	MaxReplicaLag       units.Duration `toml:"max_replica_lag"`
	ReplicaPollInterval units.Duration `toml:"replica_poll_interval"`
	// TLS, when the section is present, wraps every connection to Redis
	// in TLS (tls.go).
	TLS *UpstreamTLS `toml:"tls"`
}

// upstream.mode values.
const (
	ModeStandalone = "standalone"
	ModeSentinel   = "sentinel"
	ModeCluster    = "cluster"
)

// EmbeddedAddress as upstream.address selects the in-process demo store
// instead of a real Redis.
const EmbeddedAddress = "embedded"

func dur(d time.Duration) units.Duration { return units.Duration{Duration: d} }

// UsesAddress reports whether u's mode dials Address (standalone);
// Sentinel and cluster modes find their servers elsewhere.
func (u Upstream) UsesAddress() bool { return u.Mode == ModeStandalone || u.Mode == "" }

// Default returns the built-in configuration, used for every key a file does
// not set.
func Default() *Config {
	c := &Config{
		Server: Server{
			Listen:            "127.0.0.1:6380",
			Admin:             "127.0.0.1:9121",
			LogLevel:          "info",
			LogFormat:         "text",
			MaxClients:        10000,
			MaxRequestBytes:   units.GB,
			MaxBulkBytes:      512 * units.MB,
			MaxArgs:           1 << 20,
			MaxInlineBytes:    64 * units.KB,
			ClientOutputLimit: 64 * units.MB,
			PubSubOutputLimit: 32 * units.MB,
			// Redis's default: client-output-buffer-limit pubsub 32mb 8mb 60.
			PubSubOutputSoftLimit: 8 * units.MB,
			PubSubOutputSoftTime:  dur(60 * time.Second),
			IdleTimeout:           dur(0),
			IdleParkAfter:         dur(2 * time.Second),
			ShutdownTimeout:       dur(10 * time.Second),
			SlowlogThreshold:      dur(10 * time.Millisecond),
			SlowlogMaxLen:         128,
			ClientWriteTimeout:    dur(10 * time.Second),
			TLS:                   ServerTLS{MinVersion: "1.2", HandshakeTimeout: dur(DefaultHandshakeTimeout)},
			AuthFailureLimit:      auth.DefaultFailBurst,
			AuthLimitExempt:       []string{},
		},
		Upstream: Upstream{
			Mode:         ModeStandalone,
			Address:      "127.0.0.1:6379",
			Sentinels:    []string{},
			Seeds:        []string{},
			Connections:  4,
			MaxPinned:    256,
			DialTimeout:  dur(2 * time.Second),
			ReplyTimeout: dur(5 * time.Second),
			DeadTimeout:  dur(30 * time.Second),
			ReconnectMin: dur(50 * time.Millisecond),
			ReconnectMax: dur(2 * time.Second),
			Databases:    16,
		},
		Policy:     policy.DefaultConfig(),
		Stampede:   stampede.DefaultConfig(),
		LocalCache: localcache.DefaultConfig(),
		Mirror:     mirror.DefaultConfig(),
	}
	replicaDefaults(&c.Upstream)
	return c
}

// Error is one problem with a configuration. Parse, Load, Validate and Apply
// return one *Error, or several joined with errors.Join, so callers can
// errors.As to inspect them and tests can check the key and line.
type Error struct {
	File string // "" when the config did not come from a file
	Line int    // 0 when unknown
	Key  string // dotted key such as "upstream.dial_timeout"; "" for syntax errors
	Msg  string

	column int // where the decoder found it, to name a key of an inline table
}

// elide shortens a message longer than maxErrorMsg around its middle,
// where a value it quotes would be: a 50 MB server.listen made a 50 MB
// error line (found by a probe). The start (what is wrong) and the end
// (what to write instead) stay.
func elide(msg string) string {
	if len(msg) <= maxErrorMsg {
		return msg
	}
	head := strings.ToValidUTF8(msg[:maxErrorMsg*2/3], "")
	tail := strings.ToValidUTF8(msg[len(msg)-maxErrorMsg/3:], "")
	return fmt.Sprintf("%s...(%d bytes)...%s", head, len(msg)-len(head)-len(tail), tail)
}

// maxErrorMsg bounds the message of an Error, in bytes.
const maxErrorMsg = 512

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(elide(e.Key) + ": ") // a made-up key may be as long
	}
	b.WriteString(elide(e.Msg))
	return b.String()
}

// Load reads and parses the TOML file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// withoutBOM drops a UTF-8 byte order mark, which some Windows editors
// write first and the TOML decoder refuses ("invalid character at start
// of key: U+00EF", found by review).
func withoutBOM(data []byte) []byte { return bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) }

// Parse decodes a TOML document over the defaults and validates the result.
// name labels errors, normally the file path.
func Parse(data []byte, name string) (*Config, error) {
	data = withoutBOM(data)
	lines, inline, errs := scan(data)
	if len(errs) == 0 {
		cfg, partial, derrs := decodeAll(data, name)
		if len(derrs) > 0 {
			for _, e := range derrs {
				if full, ok := inline[[2]int{e.Line, e.column}]; ok {
					e.Key = full
				} else {
					e.Key = lines.indexed(e.Key, e.Line)
				}
			}
			errs = derrs
			if partial != nil {
				// The rest of the file, checked as well: an operator
				// fixed a file one run at a time, the values it checks
				// coming up only once every wrong-typed value and unknown
				// key was fixed (found by a probe). The keys at fault
				// hold their defaults here, which other values of their
				// table may be checked against (reconnect_max against
				// reconnect_min, an address against the mode): that
				// table's checks wait for them to be fixed (found by
				// review: "must be >= upstream.reconnect_min (50ms)",
				// the default's).
				partial.bindUserScopes()
				partial.fillUpstreamDefaults()
				partial.bindListenerScopes()
				for _, e := range partial.check() {
					if !slices.ContainsFunc(derrs, func(d *Error) bool { return tableOf(d.Key) == tableOf(e.Key) }) {
						errs = append(errs, e)
					}
				}
			}
		} else {
			cfg.bindUserScopes()
			cfg.fillUpstreamDefaults()
			cfg.bindListenerScopes()
			if errs = cfg.check(); len(errs) == 0 {
				return cfg, nil
			}
		}
	}
	text := strings.Split(string(data), "\n")
	for _, e := range errs {
		e.File = name
		if e.Line == 0 {
			e.Line = lines.find(e.Key)
			// Found at a table's header, the key is not in the file (keys
			// of inline tables are found at their line, not a header): the
			// value at fault is a default (lowering max_request_bytes alone
			// trips max_bulk_bytes's; found by a user's trial).
			if _, set := lines[e.Key]; !set && e.Key != "" && e.Line > 0 && e.Line <= len(text) &&
				strings.HasPrefix(strings.TrimSpace(text[e.Line-1]), "[") && strings.Contains(e.Msg, "got ") && !strings.HasSuffix(e.Msg, defaultNote) {
				e.Msg += defaultNote
			}
		}
	}
	return nil, join(errs)
}

const defaultNote = " (its default: the file does not set it)"

// tableOf is the top-level table a dotted key is in ("upstream" for
// "upstream.tls.ca_file", "users[1]" for "users[1].name"); a key at the
// top level is its own.
func tableOf(key string) string {
	t, _, _ := strings.Cut(key, ".")
	return t
}

// maxDecodeErrors bounds how many wrong-typed values decodeAll reports,
// each costing a decode of the whole file.
const maxDecodeErrors = 20

// decodeAll decodes data over the defaults and returns every wrong-typed
// value and unknown key it finds, not only the first: the decoder stops at
// the first type error, so an operator fixed a file one run at a time (a
// user's trial). After a type error the offending line is blanked and the
// file decoded again; a value spanning lines then fails to parse, which
// ends the search with what was found.
//
// With errors, partial is the file decoded without the lines at fault,
// when that decoded (and with unknown keys, the rest of the file), for
// the values' checks; nil otherwise.
func decodeAll(data []byte, name string) (cfg, partial *Config, errs []*Error) {
	for range maxDecodeErrors {
		cfg := Default()
		err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(cfg)
		if err == nil {
			if len(errs) == 0 {
				return cfg, nil, nil
			}
			return nil, cfg, errs
		}
		var strict *toml.StrictMissingError
		var de *toml.DecodeError
		switch {
		case errors.As(err, &strict):
			// Reported once the rest decoded, all together.
			for i := range strict.Errors {
				e := fromDecodeError(&strict.Errors[i], name)
				e.Msg = "unknown key"
				errs = append(errs, e)
			}
			return nil, cfg, errs
		case !errors.As(err, &de):
			return nil, nil, append(errs, &Error{File: name, Msg: err.Error()})
		}
		line, _ := de.Position()
		if len(errs) > 0 && (len(de.Key()) == 0 || line < 1) {
			// Blanking a line broke the file's syntax: what is left was
			// a value spanning lines.
			return nil, nil, errs
		}
		e := fromDecodeError(de, name)
		if strings.HasSuffix(e.Msg, "is already defined") {
			e.Key = qualifyKey(data, line, e.Key)
		}
		errs = append(errs, e)
		if len(de.Key()) == 0 || isTableHeader(data, line) {
			// A syntax error: nothing after it can be read. Or a table
			// header at fault ("table server already exists as defined
			// by a dotted key"): blanked, the keys under it would move
			// to the table above and be reported as made-up errors, in
			// Go's terms (found by review).
			return nil, nil, errs
		}
		data = blankLine(data, line)
	}
	return nil, nil, errs
}

// qualifyKey names key, which the TOML parser reports relative to its
// table for a key defined twice ("listen"), by its full name
// ("server.listen"): the table is the last header above line n.
func qualifyKey(data []byte, n int, key string) string {
	lines := bytes.Split(data, []byte("\n"))
	for i := min(n, len(lines)) - 2; i >= 0; i-- {
		m := tableHeader.FindSubmatch(bytes.TrimSpace(lines[i]))
		if m == nil {
			continue // a key, or a line of a value spanning lines ("  [1, 2],")
		}
		table := string(m[2])
		if len(m[1]) > 0 {
			// [[users]]: the how-manyth, as the other errors name it
			// (users[1].name).
			nth := 0
			for _, l := range lines[:i] {
				if h := tableHeader.FindSubmatch(bytes.TrimSpace(l)); h != nil && len(h[1]) > 0 && string(h[2]) == table {
					nth++
				}
			}
			table = fmt.Sprintf("%s[%d]", table, nth)
		}
		if strings.HasPrefix(key, table+".") {
			return key
		}
		return table + "." + key
	}
	return key
}

// tableHeader is a TOML table header line, [name] or [[name]] (m[1]), of
// bare dotted names (m[2]), as the configuration's tables are.
var tableHeader = regexp.MustCompile(`^\[(\[?)\s*([A-Za-z0-9_\-]+(?:\s*\.\s*[A-Za-z0-9_\-]+)*)\s*\]\]?\s*(?:#.*)?$`)

// isTableHeader reports whether line n (1-based) of data is a table header
// ([server], [[users]]).
func isTableHeader(data []byte, n int) bool {
	lines := bytes.SplitN(data, []byte("\n"), n+1)
	return n >= 1 && n <= len(lines) && bytes.HasPrefix(bytes.TrimSpace(lines[n-1]), []byte("["))
}

// blankLine returns a copy of data with line n (1-based) replaced by
// spaces; lines keep their numbers.
func blankLine(data []byte, n int) []byte {
	out := slices.Clone(data)
	start := 0
	for i := 1; i < n; i++ {
		nl := bytes.IndexByte(out[start:], '\n')
		if nl < 0 {
			return out
		}
		start += nl + 1
	}
	end := bytes.IndexByte(out[start:], '\n')
	if end < 0 {
		end = len(out) - start
	}
	for i := start; i < start+end; i++ {
		if out[i] != '\r' {
			out[i] = ' '
		}
	}
	return out
}

// Locate points an error about the configuration read from path (an
// *Error with no file, such as ExposureError's) at path and the line that
// sets its key, or the key's table; other errors pass unchanged.
func Locate(err error, path string) error {
	var e *Error
	if !errors.As(err, &e) || e.File != "" {
		return err
	}
	located := *e
	located.File = path
	if data, rerr := os.ReadFile(path); rerr == nil {
		if idx, _, _ := scan(withoutBOM(data)); idx != nil {
			located.Line = idx.find(e.Key)
		}
	}
	return &located
}

func fromDecodeError(de *toml.DecodeError, name string) *Error {
	line, column := de.Position()
	return &Error{
		File:   name,
		Line:   line,
		column: column,
		Key:    strings.Join(de.Key(), "."),
		Msg:    plainTypeError(strings.TrimPrefix(de.Error(), "toml: ")),
	}
}

// wrongType is the TOML decoder's message for a value of the wrong type,
// which names Go's struct fields and types ("cannot decode TOML integer
// into struct field config.Server.Listen of type string").
var wrongType = regexp.MustCompile(`^cannot decode TOML (\w+) into (?:struct field \S+ of type|a Go value of type) (\S+)$`)

// plainTypeError says what a wrong-typed value should have been, in the
// file's terms; other messages pass unchanged.
func plainTypeError(msg string) string {
	m := wrongType.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := map[string]string{
		"string": `a string (in quotes)`,
		"bool":   "true or false",
		"int":    "an integer", "int64": "an integer", "uint": "an integer", "uint64": "an integer",
		"float64":  "a number",
		"[]string": `an array of strings, e.g. ["a", "b"]`,
	}[m[2]]
	switch {
	case want != "":
	case strings.HasPrefix(m[2], "map["):
		want = "a table"
	case strings.HasPrefix(m[2], "[]") && strings.Contains(m[2], "."):
		want = "an array of tables ([[name]] sections)"
	case strings.Contains(m[2], "."):
		want = "a table (a [name] section)" // a struct of the configuration
	default:
		return msg
	}
	return fmt.Sprintf("want %s, got a TOML %s", want, m[1])
}

// join orders errors by line so they read like the file, then combines them.
func join(errs []*Error) error {
	slices.SortStableFunc(errs, func(a, b *Error) int { return a.Line - b.Line })
	if len(errs) == 1 {
		return errs[0]
	}
	list := make([]error, len(errs))
	for i, e := range errs {
		list[i] = e
	}
	return errors.Join(list...)
}

// Overrides are the command-line flags that take precedence over the file.
// An empty string means the flag was not given.
type Overrides struct {
	Listen   string // --listen   -> server.listen
	Upstream string // --upstream -> upstream.address
	Admin    string // --admin    -> server.admin
	// NoAdmin is an explicitly empty --admin: server.admin = "", the admin
	// HTTP server off, whatever the file says.
	NoAdmin  bool
	LogLevel string // --log-level -> server.log_level
	// LocalTier is --local-tier: "on" or "off" -> localcache.enabled.
	LocalTier string
	// AllowUnauthenticated is --allow-unauthenticated ->
	// server.allow_unauthenticated; NoAllowUnauthenticated is an explicit
	// --allow-unauthenticated=false (REDPROXY_ALLOW_UNAUTHENTICATED=false),
	// which turns it off whatever the file says.
	AllowUnauthenticated   bool
	NoAllowUnauthenticated bool
	AdminTokenFile         string // --admin-token-file -> admin.token_file
	// Sources names where a flag's value came from when not the command
	// line, by the flag as errors name it ("--log-level" ->
	// "REDPROXY_LOG_LEVEL"): an error then names what the operator set.
	Sources map[string]string
}

// source is how an error names flag: where its value came from.
func (o *Overrides) source(flag string) string {
	if s, ok := o.Sources[flag]; ok {
		return s
	}
	return flag
}

// FlagFor names the flag (or the environment variable) that set key, ""
// when the file's value, or the default, is in force: an error about key
// then names it instead of the file's line.
func (o *Overrides) FlagFor(key string) string {
	switch {
	case key == "server.listen" && o.Listen != "":
		return o.source("--listen")
	case key == "upstream.address" && o.Upstream != "":
		return o.source("--upstream")
	case key == "server.admin" && (o.Admin != "" || o.NoAdmin):
		return o.source("--admin")
	case key == "server.log_level" && o.LogLevel != "":
		return o.source("--log-level")
	case key == "admin.token_file" && o.AdminTokenFile != "":
		return o.source("--admin-token-file")
	case key == "server.allow_unauthenticated" && (o.AllowUnauthenticated || o.NoAllowUnauthenticated):
		return o.source("--allow-unauthenticated")
	}
	return ""
}

// Apply returns a new snapshot with the overrides applied and validated; c is
// left untouched. Errors name the flag as well as the key.
func (c *Config) Apply(o Overrides) (*Config, error) {
	// A plain copy is a deep copy while every field is a value type; a section
	// added later with slices or maps must be copied explicitly here. Policy's
	// slices and upstream.sentinels are shared, which is safe because no
	// override changes them and snapshots are never modified.
	n := *c
	n.Stampede = c.Stampede.Clone()
	flags := map[string]string{}
	set := func(dst *string, val, key, flag string) {
		if val != "" {
			*dst = val
			flags[key] = o.source(flag)
		}
	}
	set(&n.Server.Listen, o.Listen, "server.listen", "--listen")
	set(&n.Upstream.Address, o.Upstream, "upstream.address", "--upstream")
	set(&n.Server.Admin, o.Admin, "server.admin", "--admin")
	if o.NoAdmin {
		n.Server.Admin = ""
	}
	set(&n.Server.LogLevel, o.LogLevel, "server.log_level", "--log-level")
	set(&n.Admin.TokenFile, o.AdminTokenFile, "admin.token_file", "--admin-token-file")
	// An explicit false wins over the file as every override does (found
	// by review: it was accepted and ignored, so a fleet that set
	// REDPROXY_ALLOW_UNAUTHENTICATED=false still ran open proxies).
	switch {
	case o.AllowUnauthenticated:
		n.Server.AllowUnauthenticated = true
	case o.NoAllowUnauthenticated:
		n.Server.AllowUnauthenticated = false
	}
	var tierErr *Error
	switch o.LocalTier {
	case "":
	case "on", "off":
		n.LocalCache.Enabled = o.LocalTier == "on"
	default:
		tierErr = &Error{Key: "localcache.enabled (" + o.source("--local-tier") + ")", Msg: fmt.Sprintf("invalid value %q (use on or off)", o.LocalTier)}
	}
	// upstream.address is not used in the other modes: --upstream there
	// would be accepted and do nothing, while its user believes the proxy
	// talks to that Redis (found by review).
	var modeErr *Error
	if o.Upstream != "" && (n.Upstream.Mode == ModeSentinel || n.Upstream.Mode == ModeCluster) {
		from := map[string]string{ModeSentinel: "upstream.sentinels", ModeCluster: "upstream.seeds"}[n.Upstream.Mode]
		modeErr = &Error{Key: "upstream.address (" + o.source("--upstream") + ")", Msg: fmt.Sprintf(
			"%q is not used with upstream.mode = %q, which finds Redis from %s: remove %s, or set upstream.mode = %q to use that address",
			o.Upstream, n.Upstream.Mode, from, o.source("--upstream"), ModeStandalone)}
	}
	// --listen may change which listener a scope's address names.
	n.Policy.Scopes = slices.Clone(c.Policy.Scopes)
	n.bindListenerScopes()
	if errs := n.check(); len(errs) > 0 || tierErr != nil || modeErr != nil {
		if tierErr != nil {
			errs = append(errs, tierErr)
		}
		if modeErr != nil {
			errs = append(errs, modeErr)
		}
		for _, e := range errs {
			if flag, ok := flags[e.Key]; ok {
				e.Key += " (" + flag + ")"
			}
		}
		return nil, join(errs)
	}
	return &n, nil
}

// sectionErrors turns a feature section's joined validation errors into
// Errors whose dotted keys ("policy.ttl[2].max") the line index resolves
// like any other key. keyed extracts the key and message from the
// section's own error type; other errors are reported against the section.
func sectionErrors(section string, err error, keyed func(error) (key, msg string, ok bool)) []*Error {
	if err == nil {
		return nil
	}
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	errs := make([]*Error, 0, len(list))
	for _, e := range list {
		if key, msg, ok := keyed(e); ok {
			errs = append(errs, &Error{Key: key, Msg: msg})
		} else {
			errs = append(errs, &Error{Key: section, Msg: e.Error()})
		}
	}
	return errs
}

func localcacheErrors(c localcache.Config) []*Error {
	return sectionErrors("localcache", c.Validate(), func(e error) (string, string, bool) {
		var le *localcache.Error
		if errors.As(e, &le) {
			return le.Key, le.Msg, true
		}
		return "", "", false
	})
}

func policyErrors(c policy.Config) []*Error {
	return sectionErrors("policy", c.Validate(), func(e error) (string, string, bool) {
		var pe *policy.Error
		if errors.As(e, &pe) {
			return pe.Key, pe.Msg, true
		}
		return "", "", false
	})
}

func stampedeErrors(c stampede.Config) []*Error {
	return sectionErrors("stampede", c.Validate(), func(e error) (string, string, bool) {
		var se *stampede.Error
		if errors.As(e, &se) {
			return se.Key, se.Msg, true
		}
		return "", "", false
	})
}

// Validate reports every invalid setting at once, joined with errors.Join.
func (c *Config) Validate() error {
	if errs := c.check(); len(errs) > 0 {
		return join(errs)
	}
	return nil
}
