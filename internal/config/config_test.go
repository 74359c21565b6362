package config

import (
	"errors"
	"fmt"
	"github.com/redproxy/redproxy/internal/auth"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// configErrors flattens what Parse/Validate/Apply return into *Error values.
func configErrors(t *testing.T, err error) []*Error {
	t.Helper()
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]*Error, 0, len(list))
	for _, e := range list {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("error %q (%T) is not a *config.Error", e, e)
		}
		out = append(out, ce)
	}
	return out
}

// leaves maps every dotted setting key to its value, so tests can cover the
// whole schema without listing it by hand.
func leaves(v reflect.Value, prefix string, out map[string]any) map[string]any {
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct && f.Type != reflect.TypeFor[units.Duration]() {
			leaves(fv, prefix+name+".", out)
			continue
		}
		out[prefix+name] = fv.Interface()
	}
	return out
}

func settings(c *Config) map[string]any { return leaves(reflect.ValueOf(*c), "", map[string]any{}) }

func TestDefaults(t *testing.T) {
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("Default() is invalid: %v", err)
	}
	if d.Server.Listen != "127.0.0.1:6380" || d.Server.MaxRequestBytes != 1<<30 ||
		d.Server.MaxInlineBytes != 64<<10 || d.Upstream.ReconnectMin.Duration != 50*time.Millisecond ||
		d.Upstream.Databases != 16 {
		t.Fatalf("unexpected defaults: %+v", d)
	}
	for _, doc := range []string{"", "# only a comment\n", "[server]\n[upstream]\n"} {
		c, err := Parse([]byte(doc), "empty.toml")
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Fatalf("Parse(%q) = %+v, want defaults", doc, c)
		}
	}
	if Default() == Default() {
		t.Fatal("Default must return a fresh snapshot each time")
	}
}

func TestParseEveryKey(t *testing.T) {
	certs := redistest.NewCerts(t)
	doc := `
[server]
listen = "0.0.0.0:7000"
admin = ""
log_level = "debug"
log_format = "json"
max_clients = 5
max_request_bytes = "768MiB"
max_bulk_bytes = "256mb"
max_args = 1000
max_inline_bytes = 4096
client_output_limit = "1GB"
pubsub_output_limit = "8 MB"
pubsub_output_soft_limit = "2MB"
pubsub_output_soft_time = "30s"
idle_timeout = "5m"
idle_park_after = "3s"
shutdown_timeout = "1s"
client_write_timeout = "7s"
slowlog_threshold = "2ms"
slowlog_max_len = 16
allow_unauthenticated = true
proxy_protocol = true
auth_failure_limit = 3
auth_limit_exempt = ["127.0.0.1", "fd00::/8"]

[admin]
token_file = "/etc/redproxy/admin.token"

[[users]]
name = "app"
password_sha256 = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
enabled = false
acl = "+@read ~cache:*"
upstream_user = "redis-app"
upstream_password_file = "/etc/redproxy/app.pw"
max_connections = 3

[server.tls]
listen = "0.0.0.0:7001"
cert_file = "SERVER_CERT"
key_file = "SERVER_KEY"
client_ca_file = "CA_FILE"
min_version = "1.3"
handshake_timeout = "3s"

[[server.listeners]]
name = "internal"
listen = "0.0.0.0:7002"
tls = true
proxy_protocol = false
namespace = "tenant-a:"

[[server.listeners]]
name = "edge"
listen = "0.0.0.0:7003"
tls = true
cert_file = "SERVER_CERT"
key_file = "SERVER_KEY"
client_ca_file = "CA_FILE"

[upstream]
mode = "sentinel"
address = "redis.internal:6390"
sentinels = ["10.0.0.1:26379"]
master_name = "cache"
sentinel_username = "watcher"
sentinel_password = "s3ntinel"
username = "proxy"
password = "s3cret"
connections = 8
max_pinned = 10
dial_timeout = "100ms"
reply_timeout = "1m30s"
dead_timeout = "2m"
reconnect_min = "10ms"
reconnect_max = "10s"
databases = 1
read_from = "replica_preferred"
max_replica_lag = "3s"
replica_poll_interval = "50ms"

[upstream.tls]
ca_file = "CA_FILE"
server_name = "redis.example"
cert_file = "CLIENT_CERT"
key_file = "CLIENT_KEY"
insecure_skip_verify = true

[stampede]
coalesce = false
max_waiters = 7

[[stampede.hold]]
pattern = "cache:*"
timeout = "3s"

[[stampede.early_refresh]]
pattern = "page:*"
beta = 2.5

[localcache]
enabled = true
max_bytes = "8MB"
staleness = "250ms"
max_ttl = "30s"
admit_min_reads = 3
admit_window = "2s"
write_ratio = 0.5
include = ["product:*"]
exclude = ["product:secret:*"]
negative_caching = true
touch_interval = "2s"

[[localcache.stale_if_error]]
pattern = "product:*"
max_age = "20s"

[upstreams.new]
address = "10.0.0.9:6379"
password = "m1rror"

[mirror]
upstream = "new"
writes = false
reads_sample = 0.25
compare = true
queue = 500
queue_bytes = "1MB"
`
	want := &Config{
		Server: Server{
			Listen:                "0.0.0.0:7000",
			Admin:                 "",
			LogLevel:              "debug",
			LogFormat:             "json",
			MaxClients:            5,
			MaxRequestBytes:       768 << 20,
			MaxBulkBytes:          256 << 20,
			MaxArgs:               1000,
			MaxInlineBytes:        4096,
			ClientOutputLimit:     1 << 30,
			PubSubOutputLimit:     8 << 20,
			PubSubOutputSoftLimit: 2 << 20,
			PubSubOutputSoftTime:  units.Duration{Duration: 30 * time.Second},
			IdleTimeout:           dur(5 * time.Minute),
			IdleParkAfter:         dur(3 * time.Second),
			ShutdownTimeout:       dur(time.Second),
			SlowlogThreshold:      dur(2 * time.Millisecond),
			SlowlogMaxLen:         16,
			ClientWriteTimeout:    dur(7 * time.Second),
			TLS: ServerTLS{Listen: "0.0.0.0:7001", CertFile: certs.ServerCert, KeyFile: certs.ServerKey,
				ClientCAFile: certs.CAFile, MinVersion: "1.3", HandshakeTimeout: dur(3 * time.Second)},
			Listeners: []Listener{
				{Name: "internal", Listen: "0.0.0.0:7002", TLS: true, ProxyProtocol: new(bool), Namespace: "tenant-a:"},
				{Name: "edge", Listen: "0.0.0.0:7003", TLS: true, CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CAFile},
			},

			AllowUnauthenticated: true,
			ProxyProtocol:        true,
			AuthFailureLimit:     3,
			AuthLimitExempt:      []string{"127.0.0.1", "fd00::/8"},
		},
		Admin:     Admin{TokenFile: "/etc/redproxy/admin.token"},
		Upstreams: map[string]Upstream{"new": withUpstreamDefaults(Upstream{Address: "10.0.0.9:6379", Password: "m1rror", Databases: 1})},
		Mirror:    mirror.Config{Upstream: "new", ReadsSample: 0.25, Compare: true, Queue: 500, QueueBytes: units.MB},
		Users: []auth.UserConfig{{
			Name: "app", PasswordSHA256: "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b",
			Enabled: new(false), ACL: "+@read ~cache:*", UpstreamUser: "redis-app", UpstreamPasswordFile: "/etc/redproxy/app.pw",
			MaxConnections: 3,
		}},
		Upstream: Upstream{
			Mode:                ModeSentinel,
			Address:             "redis.internal:6390",
			Sentinels:           []string{"10.0.0.1:26379"},
			Seeds:               []string{},
			MasterName:          "cache",
			SentinelUsername:    "watcher",
			SentinelPassword:    "s3ntinel",
			Username:            "proxy",
			Password:            "s3cret",
			Connections:         8,
			MaxPinned:           10,
			DialTimeout:         dur(100 * time.Millisecond),
			ReplyTimeout:        dur(90 * time.Second),
			DeadTimeout:         dur(2 * time.Minute),
			ReconnectMin:        dur(10 * time.Millisecond),
			ReconnectMax:        dur(10 * time.Second),
			Databases:           1,
			ReadFrom:            ReadReplicaPreferred,
			MaxReplicaLag:       dur(3 * time.Second),
			ReplicaPollInterval: dur(50 * time.Millisecond),
			TLS: &UpstreamTLS{CAFile: certs.CAFile, ServerName: "redis.example", CertFile: certs.ClientCert,
				KeyFile: certs.ClientKey, InsecureSkipVerify: true},
		},
		Policy: policy.DefaultConfig(),
		Stampede: stampede.Config{
			Coalesce:     false,
			MaxWaiters:   7,
			Hold:         []stampede.HoldRule{{Pattern: "cache:*", Timeout: dur(3 * time.Second)}},
			EarlyRefresh: []stampede.RefreshRule{{Pattern: "page:*", Beta: 2.5}},
		},
		LocalCache: localcache.Config{
			Enabled:         true,
			MaxBytes:        8 << 20,
			Staleness:       dur(250 * time.Millisecond),
			MaxTTL:          dur(30 * time.Second),
			AdmitMinReads:   3,
			AdmitWindow:     dur(2 * time.Second),
			WriteRatio:      0.5,
			Include:         []string{"product:*"},
			Exclude:         []string{"product:secret:*"},
			NegativeCaching: true,
			StaleIfError:    []localcache.StaleRule{{Pattern: "product:*", MaxAge: dur(20 * time.Second)}},
			TouchInterval:   dur(2 * time.Second),
		},
	}
	doc = strings.NewReplacer("SERVER_CERT", certs.ServerCert, "SERVER_KEY", certs.ServerKey, "CA_FILE", certs.CAFile,
		"CLIENT_CERT", certs.ClientCert, "CLIENT_KEY", certs.ClientKey).Replace(doc)
	got, err := Parse([]byte(doc), "all.toml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// Every setting must differ from its default here; otherwise a key that is
	// silently ignored would still pass the comparison above.
	def := settings(Default())
	for key, v := range settings(got) {
		if strings.HasPrefix(key, "policy.") {
			continue // package policy tests its own keys; TestPolicySection covers the plumbing
		}
		if key == "upstream.mode" || key == "upstream.seeds" {
			continue // cluster mode excludes the local tier this document enables: TestUpstreamClusterMode
		}
		if key == "upstreams" || key == "route" || key == "channel_route" {
			continue // not in this document (they need servers to name): TestRoutesSection
		}
		if reflect.DeepEqual(v, def[key]) {
			t.Errorf("%s: test document does not change the default %v", key, v)
		}
	}
}

func TestEmbeddedUpstream(t *testing.T) {
	c, err := Parse([]byte("[upstream]\naddress = \"embedded\"\n"), "e.toml")
	if err != nil || c.Upstream.Address != EmbeddedAddress {
		t.Fatalf("got %v, %v", c, err)
	}
}

type wantErr struct {
	line int
	key  string
	msg  string // substring
}

func TestParseSentinelMode(t *testing.T) {
	doc := `[upstream]
mode = "sentinel"
sentinels = ["10.0.0.1:26379", "10.0.0.2:26379"]
master_name = "mymaster"
sentinel_password = "s3cret"
`
	c, err := Parse([]byte(doc), "s.toml")
	if err != nil {
		t.Fatal(err)
	}
	u := c.Upstream
	if u.Mode != ModeSentinel || len(u.Sentinels) != 2 || u.Sentinels[1] != "10.0.0.2:26379" || u.MasterName != "mymaster" || u.SentinelPassword != "s3cret" {
		t.Fatalf("upstream = %+v", u)
	}
	out, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cret") {
		t.Fatalf("effective configuration shows the sentinel password:\n%s", out)
	}
	if got := RestartOnly("upstream.master_name"); got == "" {
		t.Error("a reload may change upstream.master_name; the watcher is only built at start")
	}
	if d := Default(); d.Upstream.Mode != ModeStandalone {
		t.Errorf("default mode = %q", d.Upstream.Mode)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []wantErr
	}{
		{"unknown key", "[server]\nlisten = \"127.0.0.1:1\"\nlisen = \"x\"\n",
			[]wantErr{{3, "server.lisen", "unknown key"}}},
		{"unknown section", "[server]\n\n[polcy]\nttl = \"1s\"\n",
			[]wantErr{{3, "polcy", "unknown key"}}},
		{"unknown keys all reported", "typo = 1\n[upstream]\nadress = \"x:1\"\npasword = \"p\"\n",
			[]wantErr{{1, "typo", "unknown key"}, {3, "upstream.adress", "unknown key"}, {4, "upstream.pasword", "unknown key"}}},
		// With a wrong-typed value or an unknown key, the values the rest
		// of the file sets are checked too: they came up only once those
		// were fixed (found by a probe).
		{"decode and check errors together", "[server]\nlog_level = \"loud\"\nmax_clients = -1\n[upstream]\nreply_timeout = \"1q\"\nconnections = 0\nadress = \"x:1\"\n",
			// (upstream.connections = 0 comes up once the upstream table's
			// own errors are fixed: below.)
			[]wantErr{{2, "server.log_level", "loud"}, {3, "server.max_clients", "got -1"}, {5, "upstream.reply_timeout", "invalid duration"},
				{7, "upstream.adress", "unknown key"}}},
		// But not where a default standing in for a value at fault is
		// what another value of its table is checked against.
		{"no check against a default standing in", "[server]\nmax_clients = -1\n[upstream]\nreconnect_min = \"1x\"\nreconnect_max = \"10ms\"\n",
			[]wantErr{{2, "server.max_clients", "got -1"}, {4, "upstream.reconnect_min", "invalid duration"}}},
		{"bad duration", "[upstream]\n\ndial_timeout = \"2x\"\n",
			[]wantErr{{3, "upstream.dial_timeout", `invalid duration "2x" (use e.g. "500ms", "2s")`}}},
		{"integer duration", "[upstream]\nreply_timeout = 5\n",
			[]wantErr{{2, "upstream.reply_timeout", "invalid value 5: write it as a string with a unit"}}},
		{"integer policy duration", "[[policy.ttl]]\npattern = \"a:*\"\nrequired = true\ndefault = 5\n",
			[]wantErr{{4, "policy.ttl[0].default", "invalid value 5: write it as a string with a unit"}}},
		{"dotted integer duration", "server.idle_timeout = 30\n",
			[]wantErr{{1, "server.idle_timeout", "invalid value 30: write it as a string with a unit"}}},
		{"negative duration", "[server]\nshutdown_timeout = \"-1s\"\n",
			[]wantErr{{2, "server.shutdown_timeout", "must not be negative"}}},
		{"slow log too long", "[server]\nslowlog_max_len = 1000000\n",
			[]wantErr{{2, "server.slowlog_max_len", "must be between 0 (off) and 10000"}}},
		{"negative auth failure limit", "[server]\nauth_failure_limit = -1\n",
			[]wantErr{{2, "server.auth_failure_limit", "must be between 0 (no limit) and 1000000"}}},
		{"bad auth limit exemption", "[server]\n\nauth_limit_exempt = [\"127.0.0.1\", \"10.0.0.0/33\", \"localhost\"]\n",
			[]wantErr{{3, "server.auth_limit_exempt[1]", `"10.0.0.0/33" is neither an IP address nor a CIDR prefix`},
				{3, "server.auth_limit_exempt[2]", `"localhost" is neither`}}},
		{"bad read_from", "[upstream]\nread_from = \"replicas\"\n",
			[]wantErr{{2, "upstream.read_from", `invalid value "replicas" (use "primary", "replica" or "replica_preferred")`}}},
		{"zero replica lag", "[upstream]\nmax_replica_lag = \"0s\"\n",
			[]wantErr{{2, "upstream.max_replica_lag", "must be > 0"}}},
		{"replica poll too fast", "[upstream]\nreplica_poll_interval = \"1ms\"\n",
			[]wantErr{{2, "upstream.replica_poll_interval", "must be at least 10ms"}}},
		{"zero dial timeout", "[upstream]\ndial_timeout = \"0s\"\n",
			[]wantErr{{2, "upstream.dial_timeout", "must be > 0"}}},
		{"bad size unit", "[server]\nmax_bulk_bytes = \"5QB\"\n",
			[]wantErr{{2, "server.max_bulk_bytes", `invalid size "5QB"`}}},
		{"fractional size", "[server]\nclient_output_limit = \"1.5GB\"\n",
			[]wantErr{{2, "server.client_output_limit", "invalid size"}}},
		{"float size", "[server]\nclient_output_limit = 1.5\n",
			[]wantErr{{2, "server.client_output_limit", "invalid value 1.5: use a whole number of bytes"}}},
		{"bool size", "[server]\nclient_output_limit = true\n",
			[]wantErr{{2, "server.client_output_limit", "invalid value true"}}},
		{"redis 1000-based suffix rejected", "[server]\nmax_inline_bytes = \"64k\"\n",
			[]wantErr{{2, "server.max_inline_bytes", "invalid size"}}},
		{"wrong type", "[server]\nmax_clients = \"many\"\n",
			[]wantErr{{2, "server.max_clients", "want an integer, got a TOML string"}}},
		{"number for a string", "[server]\nlisten = 6380\n",
			[]wantErr{{2, "server.listen", "want a string (in quotes), got a TOML integer"}}},
		{"string for a bool", "[localcache]\nenabled = \"yes\"\n",
			[]wantErr{{2, "localcache.enabled", "want true or false, got a TOML string"}}},
		// Said in the file's terms, not Go's ("struct field
		// config.Config.Server of type config.Server"; found by a probe).
		{"string for a table", "server = \"yes\"\n",
			[]wantErr{{1, "server", "want a table (a [name] section), got a TOML string"}}},
		{"string for an array of tables", "users = \"x\"\n",
			[]wantErr{{1, "users", "want an array of tables ([[name]] sections), got a TOML string"}}},
		// A key defined twice is named in full (it was "listen").
		{"key defined twice", "[server]\nlisten = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"\n",
			[]wantErr{{3, "server.listen", "already defined"}}},
		{"key defined twice in an array of tables", "[[users]]\nname = \"a\"\npassword_sha256 = \"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"\n[[users]]\nname = \"b\"\nname = \"c\"\npassword_sha256 = \"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"\n",
			[]wantErr{{6, "users[1].name", "already defined"}}},
		// Every wrong-typed value and unknown key in one run, not the
		// first alone (a user's trial fixed a file one run at a time).
		{"several wrong types", "[server]\nlisten = 6380\nadmin = true\nbogus = 1\n[upstream]\nconnections = \"four\"\nnonsense = 2\n",
			[]wantErr{{2, "server.listen", "want a string (in quotes), got a TOML integer"}, {3, "server.admin", "want a string (in quotes), got a TOML boolean"},
				{4, "server.bogus", "unknown key"}, {6, "upstream.connections", "want an integer, got a TOML string"}, {7, "upstream.nonsense", "unknown key"}}},
		// Keys of inline tables are named in full, array index included,
		// as the same keys written under [table] headers are (the decoder
		// named them "bogus" or "stampede.bogus"; found by a probe).
		{"unknown key in an inline table", "server = { listen = \"127.0.0.1:1\", bogus = 1 }\n",
			[]wantErr{{1, "server.bogus", "unknown key"}}},
		{"unknown key in an inline table of an array", "[stampede]\nhold = [{pattern=\"c:*\", timeout=\"1s\"}, {pattern=\"d:*\", timeout=\"1s\", bogus=2}]\n",
			[]wantErr{{2, "stampede.hold[1].bogus", "unknown key"}}},
		{"unknown key in an inline array of tables", "users = [{name=\"a\", password_sha256=\"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\", bogus=1}]\n",
			[]wantErr{{1, "users[0].bogus", "unknown key"}}},
		{"wrong type in an inline table", "[server]\ntls = { listen = \"x\", min_version = 5 }\n",
			[]wantErr{{2, "server.tls.min_version", "want a string (in quotes), got a TOML integer"}}},
		{"wrong type in an inline table of an array", "[stampede]\nhold = [{pattern=\"c:*\", timeout=\"1s\"}, {pattern=5, timeout=\"1s\"}]\n",
			[]wantErr{{2, "stampede.hold[1].pattern", "want a string (in quotes), got a TOML integer"}}},
		// A value inside an inline table's array, and an array where a
		// string belongs there (found by review).
		{"wrong type in an array of an inline table", "[policy]\ncommands = { deny = [1, 2] }\n",
			[]wantErr{{2, "policy.commands.deny", "want a string (in quotes), got a TOML integer"}}},
		{"array for a string in an inline table", "[stampede]\nhold = [{pattern  =  [1], timeout=\"1s\"}]\n",
			[]wantErr{{2, "stampede.hold[0].pattern", "want a string (in quotes), got a TOML array"}}},
		// A duration written as a number inside an inline table is caught
		// by scan, as outside one (it was "invalid duration", no line).
		{"number for a duration in an inline table", "[stampede]\nhold = [{pattern=\"c:*\", timeout=5}]\n",
			[]wantErr{{2, "stampede.hold[0].timeout", "invalid value 5: write it as a string with a unit"}}},
		// Elements of an array spanning lines are found at their own
		// lines, so blanking one leaves the array whole.
		{"wrong type spanning lines", "[policy.commands]\ndeny = [\n  1,\n  2,\n]\n[upstream]\nconnections = \"four\"\n",
			[]wantErr{{3, "policy.commands.deny", "want a string (in quotes), got a TOML integer"}, {4, "policy.commands.deny", "want a string (in quotes), got a TOML integer"},
				{7, "upstream.connections", "want an integer, got a TOML string"}}},
		// A wrong value whose text spans lines ends the search there:
		// blanked, its first line leaves the rest unparsable.
		{"wrong type in a multi-line string", "[upstream]\nconnections = \"\"\"\nfour\n\"\"\"\n[server]\nlisten = 6380\n",
			[]wantErr{{2, "upstream.connections", "want an integer, got a TOML string"}}},
		{"syntax error", "[server\nlisten = 1\n",
			[]wantErr{{1, "", "expected ']'"}}},
		{"max_clients zero", "[server]\nmax_clients = 0\n",
			[]wantErr{{2, "server.max_clients", "must be > 0"}}},
		{"request too small", "[server]\nmax_request_bytes = 512\nmax_bulk_bytes = 100\nmax_inline_bytes = 100\n",
			[]wantErr{{2, "server.max_request_bytes", "between 1KB and 4GB"}}},
		{"request too large", "[server]\nmax_request_bytes = \"5GB\"\n",
			[]wantErr{{2, "server.max_request_bytes", "got 5GB"}}},
		{"bulk above request", "[server]\nmax_request_bytes = \"1MB\"\nmax_inline_bytes = \"1KB\"\n",
			// max_bulk_bytes keeps its default, so the error points at the
			// section header where the operator would add it, and says
			// the value is the default.
			[]wantErr{{1, "server.max_bulk_bytes", "<= server.max_request_bytes (1MB), got 512MB (its default: the file does not set it)"}}},
		{"max_args zero", "[server]\nmax_args = 0\n",
			[]wantErr{{2, "server.max_args", "must be between 1"}}},
		{"inline zero", "[server]\nmax_inline_bytes = 0\n",
			[]wantErr{{2, "server.max_inline_bytes", "must be > 0"}}},
		{"output limits", "[server]\nclient_output_limit = 0\npubsub_output_limit = -1\npubsub_output_soft_limit = -1\npubsub_output_soft_time = \"-1s\"\n",
			[]wantErr{{2, "server.client_output_limit", "must be > 0"}, {3, "server.pubsub_output_limit", "must be > 0"},
				{4, "server.pubsub_output_soft_limit", "must be >= 0"}, {5, "server.pubsub_output_soft_time", "must not be negative"}}},
		{"log level", "[server]\nlog_level = \"verbose\"\n",
			[]wantErr{{2, "server.log_level", `invalid level "verbose"`}}},
		{"log format", "[server]\nlog_format = \"xml\"\n",
			[]wantErr{{2, "server.log_format", `invalid format "xml"`}}},
		{"listen not host:port", "[server]\nlisten = \"6380\"\n",
			[]wantErr{{2, "server.listen", `invalid address "6380"`}}},
		{"admin bad port", "[server]\nadmin = \"127.0.0.1:99999\"\n",
			[]wantErr{{2, "server.admin", "invalid port"}}},
		{"upstream port zero", "[upstream]\naddress = \"127.0.0.1:0\"\n",
			[]wantErr{{2, "upstream.address", "invalid port"}}},
		{"username without password", "[upstream]\nusername = \"u\"\n",
			[]wantErr{{2, "upstream.username", "password is empty"}}},
		{"connections range", "[upstream]\nconnections = 65\n",
			[]wantErr{{2, "upstream.connections", "between 1 and 64, got 65"}}},
		{"max_pinned zero", "[upstream]\nmax_pinned = 0\n",
			[]wantErr{{2, "upstream.max_pinned", "must be > 0"}}},
		{"reconnect order", "[upstream]\nreconnect_min = \"3s\"\n",
			[]wantErr{{1, "upstream.reconnect_max", ">= upstream.reconnect_min (3s), got 2s"}}},
		{"databases zero", "[upstream]\ndatabases = 0\n",
			[]wantErr{{2, "upstream.databases", "must be between 1 and 10000, got 0"}}},
		// Passed the check and ran the proxy out of memory at start.
		{"databases huge", "[upstream]\ndatabases = 1000000000000\n",
			[]wantErr{{2, "upstream.databases", "must be between 1 and 10000, got 1000000000000"}}},
		{"unknown mode", "[upstream]\nmode = \"sentinal\"\n",
			[]wantErr{{2, "upstream.mode", `invalid mode "sentinal" (use "standalone", "sentinel" or "cluster")`}}},
		{"cluster mode needs seeds", "[upstream]\nmode = \"cluster\"\n",
			[]wantErr{{1, "upstream.seeds", "at least one seed"}}},
		{"seeds without cluster mode", "[upstream]\nmode = \"sentinel\"\nmaster_name = \"m\"\nsentinels = [\"127.0.0.1:26379\"]\nseeds = [\"127.0.0.1:7000\"]\n",
			[]wantErr{{5, "upstream.seeds", `not used with upstream.mode = "sentinel"`}}},
		{"negative max_connections", "[[users]]\nname = \"app\"\npassword_sha256 = \"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all ~*\"\nmax_connections = -1\n",
			[]wantErr{{5, "users[0].max_connections", "must be 0 (no limit) or more"}}},
		{"own upstream credential in cluster mode", "[upstream]\nmode = \"cluster\"\nseeds = [\"127.0.0.1:7000\"]\n[[users]]\nname = \"app\"\npassword_sha256 = \"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all ~*\"\nupstream_user = \"app\"\nupstream_password_file = \"/dev/null\"\n",
			[]wantErr{{8, "users[0].upstream_user", "not supported in cluster mode"}}},
		{"overlapping namespaces", "[[users]]\nname = \"a\"\npassword_sha256 = \"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all ~*\"\nnamespace = \"t1\"\n[[users]]\nname = \"b\"\npassword_sha256 = \"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all ~*\"\nnamespace = \"t10\"\n[[users]]\nname = \"c\"\npassword_sha256 = \"2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\"\nacl = \"+@all ~*\"\nnamespace = \"t10\"\n",
			[]wantErr{{10, "users[1].namespace", `"t10" overlaps users[0].namespace "t1"`}, {15, "users[2].namespace", `"t10" overlaps users[0].namespace "t1"`}}},
		{"sentinel settings in cluster mode", "[upstream]\nmode = \"cluster\"\nseeds = [\"127.0.0.1:7000\"]\nmaster_name = \"m\"\n",
			[]wantErr{{4, "upstream.master_name", `not used with upstream.mode = "cluster"`}}},
		{"sentinel mode needs sentinels and a name", "[upstream]\nmode = \"sentinel\"\n",
			[]wantErr{{1, "upstream.sentinels", "is empty"}, {1, "upstream.master_name", "is empty"}}},
		{"sentinel addresses checked", "[upstream]\nmode = \"sentinel\"\nmaster_name = \"m\"\nsentinels = [\"127.0.0.1:26379\", \"nope\", \"127.0.0.1:26379\"]\n",
			[]wantErr{{4, "upstream.sentinels[1]", `invalid address "nope"`}, {4, "upstream.sentinels[2]", "listed twice"}}},
		{"sentinel username without password", "[upstream]\nmode = \"sentinel\"\nmaster_name = \"m\"\nsentinels = [\"127.0.0.1:26379\"]\nsentinel_username = \"u\"\n",
			[]wantErr{{5, "upstream.sentinel_username", "sentinel_password is empty"}}},
		{"sentinel settings without sentinel mode", "[upstream]\nmaster_name = \"m\"\n",
			[]wantErr{{2, "upstream.master_name", `not used with upstream.mode = "standalone"`}}},
		{"inline table falls back to its line", "\nupstream = { connections = 0 }\n",
			[]wantErr{{2, "upstream.connections", "between 1 and 64"}}},
		{"multiple errors reported together, in file order", `
[server]
max_clients = -1
log_level = "loud"

[upstream]
connections = 0
databases = 0
`, []wantErr{
			{3, "server.max_clients", "must be > 0"},
			{4, "server.log_level", "invalid level"},
			{7, "upstream.connections", "between 1 and 64"},
			{8, "upstream.databases", "must be between 1 and 10000"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc), "config.toml")
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			if c != nil {
				t.Fatal("Parse returned a config along with an error")
			}
			got := configErrors(t, err)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(tt.want), err)
			}
			for i, w := range tt.want {
				g := got[i]
				if g.File != "config.toml" || g.Line != w.line || g.Key != w.key || !strings.Contains(g.Msg, w.msg) {
					t.Errorf("error %d = {%s %d %q %q}, want {config.toml %d %q containing %q}",
						i, g.File, g.Line, g.Key, g.Msg, w.line, w.key, w.msg)
				}
			}
		})
	}
}

func TestErrorFormat(t *testing.T) {
	_, err := Parse([]byte("[upstream]\nread = 1\n\n\n\n\n\n\n\n\n\n\n"+
		"[server]\nidle_timeout = \"2x\"\n"), "config.toml")
	// Both, in the file's order, although the decoder stops at the type
	// error before it sees the unknown key (decodeAll).
	const want = "config.toml:2: upstream.read: unknown key\n" +
		`config.toml:14: server.idle_timeout: invalid duration "2x" (use e.g. "500ms", "2s")`
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}

	c := Default()
	c.Server.MaxClients = 0
	c.Upstream.Connections = 0
	err = c.Validate()
	const want2 = "server.max_clients: must be > 0, got 0\nupstream.connections: must be between 1 and 64, got 0"
	if err == nil || err.Error() != want2 {
		t.Fatalf("Validate() =\n%v\nwant\n%s", err, want2)
	}
}

func TestOverrides(t *testing.T) {
	base, err := Parse([]byte("[server]\nlisten = \"127.0.0.1:7000\"\nlog_level = \"warn\"\n"), "c.toml")
	if err != nil {
		t.Fatal(err)
	}
	before := *base

	same, err := base.Apply(Overrides{})
	if err != nil || !reflect.DeepEqual(same, base) {
		t.Fatalf("empty overrides changed the config: %+v, %v", same, err)
	}

	got, err := base.Apply(Overrides{Listen: ":0", Upstream: "10.0.0.1:6379", Admin: "127.0.0.1:0", LogLevel: "debug"})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	want := before
	want.Server.Listen, want.Upstream.Address, want.Server.Admin, want.Server.LogLevel = ":0", "10.0.0.1:6379", "127.0.0.1:0", "debug"
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("got %+v\nwant %+v", *got, want)
	}
	if !reflect.DeepEqual(*base, before) {
		t.Fatal("Apply mutated the original snapshot")
	}

	// An explicitly empty --admin turns the admin server off.
	off, err := base.Apply(Overrides{NoAdmin: true})
	if err != nil || off.Server.Admin != "" || base.Server.Admin == "" {
		t.Fatalf("NoAdmin: admin %q (base %q), %v", off.Server.Admin, base.Server.Admin, err)
	}

	_, err = base.Apply(Overrides{Upstream: "nohost", LogLevel: "chatty"})
	errs := configErrors(t, err)
	if len(errs) != 2 || errs[0].Key != "server.log_level (--log-level)" || errs[1].Key != "upstream.address (--upstream)" {
		t.Fatalf("Apply errors = %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "redproxy.toml")
	if err := os.WriteFile(path, []byte("[upstream]\nconnections = 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil || c.Upstream.Connections != 2 {
		t.Fatalf("Load = %+v, %v", c, err)
	}

	if err := os.WriteFile(path, []byte("[upstream]\nconnections = 99\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":2: upstream.connections:") {
		t.Fatalf("Load error = %v, want it to start with %s:2", err, path)
	}

	if _, err := Load(filepath.Join(dir, "missing.toml")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load(missing) = %v, want fs.ErrNotExist", err)
	}
}

// The example file documents every setting with its default; this keeps it
// from drifting from the code in either direction. The [policy] section is
// the exception: it ships the seeds' policy rather than the default (which
// only refuses KEYS, FLUSHALL and FLUSHDB), and must be exactly the policy
// package's tested example.
func TestExampleFileMatchesDefaults(t *testing.T) {
	const path = "../../config.example.toml"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data, path)
	if err != nil {
		t.Fatalf("example does not parse: %v", err)
	}
	def := settings(Default())
	got := settings(c)
	for key, v := range def {
		if strings.HasPrefix(key, "policy.") {
			continue
		}
		// The example turns the local tier on; everything else in its
		// section is the default.
		if key == "localcache.enabled" {
			continue
		}
		if !reflect.DeepEqual(got[key], v) {
			t.Errorf("%s: example sets %v, default is %v", key, got[key], v)
		}
	}
	lines, _, _ := scan(data)
	for key := range def {
		// Scopes are documented in comments: an empty "scope = []" would
		// stop users from adding [[policy.scope]] tables below it.
		// The same holds for the stampede rule lists.
		// [upstream.tls] turns TLS on by being present, so the example
		// shows it commented out.
		// Routes turn on by being present, and exclude the example's
		// local tier: shown commented out.
		if key == "upstreams" || key == "route" || key == "channel_route" {
			continue
		}
		if key == "policy.scope" || key == "server.listeners" || key == "upstream.tls" || key == "users" || key == "stampede.hold" || key == "stampede.early_refresh" || key == "localcache.stale_if_error" {
			continue
		}
		if _, ok := lines[key]; !ok {
			t.Errorf("%s is not documented in %s", key, path)
		}
	}

	if _, err := policy.Compile(c.Policy); err != nil {
		t.Fatalf("example policy does not compile: %v", err)
	}
	seedDoc, err := os.ReadFile("../policy/testdata/policy.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	seeds, err := Parse(seedDoc, "policy.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Policy, seeds.Policy) {
		t.Errorf("the example's [policy] differs from internal/policy/testdata/policy.example.toml:\n got %+v\nwant %+v", c.Policy, seeds.Policy)
	}
}

// TestPolicySection: policy errors come back as *Error with the line of the
// array-table entry they are in, and a valid section is decoded.
func TestPolicySection(t *testing.T) {
	doc := `[policy]
mode = "report"

[[policy.ttl]]
pattern = "session:*"
required = true
default = "24h"

[[policy.ttl]]
pattern = "cache:*"
max = "1.5s"

[policy.commands]
deny = ["debug", "flushal"]

[[policy.scope]]
name = "admin"
users = ["admin"]

[[policy.scope]]
name = "batch"
listeners = ["127.0.0.1:6380"] # server.listen's address: the "plain" listener
[[policy.scope.ttl]]
pattern = "x"
max = "1m"
max_action = "sometimes"
`
	_, err := Parse([]byte(doc), "p.toml")
	if err == nil {
		t.Fatal("invalid policy accepted")
	}
	got := configErrors(t, err)
	want := []wantErr{
		{11, "policy.ttl[1].max", "whole number of seconds"},
		{14, "policy.commands.deny[1]", `unknown command "flushal"`},
		// No [[users]]: every client is the upstream's user, "default",
		// so a scope for "admin" would never apply.
		{18, "policy.scope[0].users[0]", `no user is named "admin" (users: default)`},
		{26, "policy.scope[1].ttl[0].max_action", `invalid value "sometimes"`},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d: %v", len(got), len(want), err)
	}
	for i, w := range want {
		if g := got[i]; g.Line != w.line || g.Key != w.key || !strings.Contains(g.Msg, w.msg) || g.File != "p.toml" {
			t.Errorf("error %d = %+v, want %+v", i, *g, w)
		}
	}

	good := strings.NewReplacer(`max = "1.5s"`, `max = "15m"`, `, "flushal"`, "", `"sometimes"`, `"refuse"`, `users = ["admin"]`, `users = ["default"]`).Replace(doc)
	c, err := Parse([]byte(good), "p.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy.Mode != "report" || len(c.Policy.TTL) != 2 || c.Policy.TTL[0].Default.Duration != 24*time.Hour ||
		len(c.Policy.Scopes) != 2 || c.Policy.Scopes[1].TTL[0].Max.Duration != time.Minute {
		t.Fatalf("decoded %+v", c.Policy)
	}
}

// TestStampedeSection: stampede errors come back as *Error with the line of
// the array-table entry they are in.
func TestStampedeSection(t *testing.T) {
	doc := `[stampede]
max_waiters = 0

[[stampede.hold]]
pattern = "cache:*"
timeout = "2s"

[[stampede.hold]]
pattern = "page:["
timeout = "0s"

[[stampede.early_refresh]]
pattern = "cache:*"
beta = -1.0
`
	_, err := Parse([]byte(doc), "s.toml")
	if err == nil {
		t.Fatal("invalid stampede section accepted")
	}
	got := configErrors(t, err)
	want := []wantErr{
		{2, "stampede.max_waiters", "must be > 0"},
		{9, "stampede.hold[1].pattern", "unclosed '['"},
		{10, "stampede.hold[1].timeout", "must be between"},
		{14, "stampede.early_refresh[0].beta", "positive number"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d: %v", len(got), len(want), err)
	}
	for i, w := range want {
		if g := got[i]; g.Line != w.line || g.Key != w.key || !strings.Contains(g.Msg, w.msg) || g.File != "s.toml" {
			t.Errorf("error %d = %+v, want %+v", i, *g, w)
		}
	}
	c, err := Parse([]byte("[[stampede.hold]]\npattern = \"cache:*\"\ntimeout = \"2s\"\n"), "s.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Stampede.Coalesce || c.Stampede.MaxWaiters != 1000 || len(c.Stampede.Hold) != 1 || c.Stampede.Hold[0].Timeout.Duration != 2*time.Second {
		t.Fatalf("decoded %+v", c.Stampede)
	}
	// Apply copies the rule lists, so snapshots never share them.
	n, err := c.Apply(Overrides{LogLevel: "debug"})
	if err != nil {
		t.Fatal(err)
	}
	n.Stampede.Hold[0].Pattern = "changed"
	if c.Stampede.Hold[0].Pattern != "cache:*" {
		t.Fatal("Apply shares stampede.hold with the original snapshot")
	}
}

// Every listener in use counts for the exposure check: a plaintext listener
// turned off ("") is not open to anyone, a TLS listener is open unless it
// requires client certificates.
func TestExposureErrorPerListener(t *testing.T) {
	for _, tc := range []struct {
		listen, tlsListen, clientCA string
		wantKey                     string
	}{
		{listen: "127.0.0.1:6380"},
		{listen: "0.0.0.0:6380", wantKey: "server.listen"},
		{listen: "", tlsListen: "127.0.0.1:6390"},
		{listen: "", tlsListen: "0.0.0.0:6390", wantKey: "server.tls.listen"},
		{listen: "", tlsListen: "0.0.0.0:6390", clientCA: "ca.pem"},
		{listen: "127.0.0.1:6380", tlsListen: "10.0.0.1:6390", wantKey: "server.tls.listen"},
	} {
		c := Default()
		c.Server.Listen, c.Server.TLS.Listen, c.Server.TLS.ClientCAFile = tc.listen, tc.tlsListen, tc.clientCA
		err := ExposureError(c)
		var ce *Error
		switch {
		case tc.wantKey == "" && err != nil:
			t.Errorf("%+v: refused: %v", tc, err)
		case tc.wantKey != "" && (!errors.As(err, &ce) || ce.Key != tc.wantKey):
			t.Errorf("%+v: got %v, want an error on %s", tc, err, tc.wantKey)
		}
		c.Server.AllowUnauthenticated = true
		if err := ExposureError(c); err != nil {
			t.Errorf("%+v with allow_unauthenticated: %v", tc, err)
		}
	}
}

func TestUpstreamClusterMode(t *testing.T) {
	c, err := Parse([]byte("[upstream]\nmode = \"cluster\"\nseeds = [\"10.0.0.1:7000\", \"node2:7001\"]\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream.Mode != ModeCluster || !reflect.DeepEqual(c.Upstream.Seeds, []string{"10.0.0.1:7000", "node2:7001"}) {
		t.Fatalf("got mode %q seeds %v", c.Upstream.Mode, c.Upstream.Seeds)
	}
	for doc, key := range map[string]string{
		"[upstream]\nmode = \"cluster\"\n":                     "upstream.seeds",
		"[upstream]\nmode = \"cluster\"\nseeds = [\"nope\"]\n": "upstream.seeds",
		"[upstream]\nmode = \"ring\"\n":                        "upstream.mode",
	} {
		_, err := Parse([]byte(doc), "t.toml")
		var e *Error
		if !errors.As(err, &e) || e.Key != key {
			t.Errorf("%q: got %v, want an error about %s", doc, err, key)
		}
	}
	// The local tier tracks per node in cluster mode (localcache/cluster.go).
	if _, err := Parse([]byte("[upstream]\nmode = \"cluster\"\nseeds = [\"a:1\"]\n[localcache]\nenabled = true\n"), "t.toml"); err != nil {
		t.Errorf("the local tier in cluster mode: %v", err)
	}
}

// A certificate, key or CA path that names a device, a pipe or a huge file
// is refused at load with a message, instead of being read forever.
func TestCertificateFilesMustBeRegular(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.pem")
	if err := os.WriteFile(big, make([]byte, maxPEMFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"/dev/zero": "not a regular file", big: "is refused"} {
		doc := fmt.Sprintf("[upstream.tls]\nca_file = %q\n", path)
		_, err := Parse([]byte(doc), "t.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ca_file = %s: got %v, want an error containing %q", path, err, want)
		}
	}
}

// Reads from replicas of a cluster [upstream] are accepted: every shard
// has its replica set (proxy/clusterreplicas.go).
func TestClusterReplicaReadsAccepted(t *testing.T) {
	c, err := Parse([]byte("[upstream]\nmode = \"cluster\"\nseeds = [\"127.0.0.1:7000\"]\nread_from = \"replica\"\n"), "c.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream.ReadFrom != ReadReplica {
		t.Fatalf("read_from = %q", c.Upstream.ReadFrom)
	}
}

// A value the file sets is never called the default, in a table or an
// inline table (where keys are found at the table's line).
func TestErrorsCallOnlyUnsetValuesDefaults(t *testing.T) {
	for _, doc := range []string{
		"[server]\nmax_request_bytes = \"1MB\"\nmax_inline_bytes = \"1KB\"\nmax_bulk_bytes = \"2MB\"\n",
		"[server]\nmax_request_bytes = \"1MB\"\nmax_inline_bytes = \"1KB\"\nmax_bulk_bytes = \"2MB\"\n[upstreams]\nq = { address = \"127.0.0.1:1\", connections = 100 }\n",
	} {
		_, err := Parse([]byte(doc), "config.toml")
		if err == nil || !strings.Contains(err.Error(), "got 2MB") {
			t.Fatalf("%q: %v; want max_bulk_bytes refused", doc, err)
		}
		if strings.Contains(doc, "upstreams") && !strings.Contains(err.Error(), "upstreams.q.connections: must be between 1 and 64, got 100") {
			t.Fatalf("%q: %v; want the inline table's connections refused", doc, err)
		}
		if strings.Contains(err.Error(), "default") {
			t.Errorf("%q: a value the file sets called a default:\n%v", doc, err)
		}
	}
}

// A UTF-8 byte order mark, which some Windows editors write first, is not
// part of the document: it was refused as "invalid character at start of
// key: U+00EF" (found by review). Errors keep their lines.
func TestParseIgnoresByteOrderMark(t *testing.T) {
	const bom = "\xef\xbb\xbf"
	cfg, err := Parse([]byte(bom+"[server]\nlisten = \"127.0.0.1:7000\"\n"), "bom.toml")
	if err != nil {
		t.Fatalf("a document starting with a BOM: %v", err)
	}
	if cfg.Server.Listen != "127.0.0.1:7000" {
		t.Fatalf("server.listen = %q", cfg.Server.Listen)
	}
	_, err = Parse([]byte(bom+"[server]\nmax_clients = -1\n"), "bom.toml")
	if err == nil || !strings.Contains(err.Error(), "bom.toml:2: server.max_clients") {
		t.Fatalf("error in a document starting with a BOM: %v, want it on line 2", err)
	}
}

// A value of the wrong type in an array table is named with its index,
// as validation names the keys there (found by review: "users.enabled").
func TestDecodeErrorsNameTheArrayIndex(t *testing.T) {
	_, err := Parse([]byte("[[policy.ttl]]\npattern = \"a:*\"\n[[policy.ttl]]\npattern = \"b:*\"\nmax = 5\n"), "c.toml")
	if err == nil || !strings.Contains(err.Error(), "c.toml:5: policy.ttl[1].max:") {
		t.Fatalf("got %v, want the error at c.toml:5 on policy.ttl[1].max", err)
	}
	_, err = Parse([]byte("[[users]]\nname = \"a\"\n[[users]]\nname = \"b\"\nenabled = \"yes\"\n"), "c.toml")
	if err == nil || !strings.Contains(err.Error(), "c.toml:5: users[1].enabled:") {
		t.Fatalf("got %v, want the error at c.toml:5 on users[1].enabled", err)
	}
}

// TestQualifyKey: the table of a key defined twice is the last header
// above it, not a line of a value spanning lines that starts with "["
// (found by review: "1, 2.listen").
func TestQualifyKey(t *testing.T) {
	doc := "[server]\nlisten = \"a\"\nx = [\n [1, 2],\n]\nlisten = \"b\"\n"
	if got := qualifyKey([]byte(doc), 6, "listen"); got != "server.listen" {
		t.Fatalf("qualifyKey = %q, want server.listen", got)
	}
	if got := qualifyKey([]byte("listen = 1\nlisten = 2\n"), 2, "listen"); got != "listen" {
		t.Fatalf("qualifyKey at the top level = %q", got)
	}
}

// TestAuthLimited: which client addresses the failed-AUTH limit applies
// to. v4-mapped prefixes and zoned IPv6 clients never matched (found by
// review).
func TestAuthLimited(t *testing.T) {
	s := Server{AuthFailureLimit: 10, AuthLimitExempt: []string{"127.0.0.1", "10.0.0.0/8", "::1", "::ffff:192.168.0.0/112", "fe80::/10"}}
	for host, limited := range map[string]bool{
		"127.0.0.1":        false,
		"127.0.0.2":        true,
		"10.1.2.3":         false,
		"::ffff:10.1.2.3":  false, // a v4-mapped client is its IPv4 address
		"11.0.0.1":         true,
		"::1":              false,
		"::2":              true,
		"192.168.4.5":      false, // by the v4-mapped prefix
		"192.169.0.1":      true,
		"fe80::1%eth0":     false, // a zone does not hide the address
		"fe80::1":          false,
		"2001:db8::1":      true,
		"not an address":   true,
		"[::1]":            true,
		"10.0.0.1%weird00": true,
	} {
		if got := s.AuthLimited(host); got != limited {
			t.Errorf("AuthLimited(%q) = %v, want %v", host, got, limited)
		}
	}
	if (&Server{AuthFailureLimit: 0}).AuthLimited("1.2.3.4") {
		t.Error("a limit of 0 still limits")
	}
	if _, err := parsePrefix("::ffff:10.0.0.0/64"); err == nil {
		t.Error("a v4-mapped prefix shorter than /96 accepted")
	}
}

// TestPositions checks the line and column scan gives a key against a
// count from the start of the file, as the decoder's errors count them,
// for offsets asked for in order and out of it. (scan once asked the
// parser, which counted from the start for every key: a file of 16,000
// [[policy.ttl]] tables took 74 s to check, 0.3 s now.)
func TestPositions(t *testing.T) {
	data := []byte("a = 1\n\n[server]\r\nlisten = \"x\"\n  b = 2\nlast")
	naive := func(off int) (int, int) {
		line, start := 1, 0
		for i := range off {
			if data[i] == '\n' {
				line++
				start = i + 1
			}
		}
		return line, off - start + 1
	}
	var offsets []int
	for off := range len(data) + 1 {
		offsets = append(offsets, off)
	}
	offsets = append(offsets, 30, 2, 6, 7, len(data), 0, 17, 17)
	p := positions{data: data}
	for _, off := range offsets {
		wl, wc := naive(off)
		if l, c := p.at(uint32(off)); l != wl || c != wc {
			t.Errorf("offset %d: line %d column %d, want %d %d", off, l, c, wl, wc)
		}
	}
}

// A huge value is not echoed whole in its error (a probe's 50 MB
// server.listen made a 50 MB error line); the start and the hint stay.
func TestHugeValueErrorIsShort(t *testing.T) {
	doc := "[server]\nlisten = \"" + strings.Repeat("x", 1<<20) + "\"\n"
	_, err := Parse([]byte(doc), "big.toml")
	if err == nil {
		t.Fatal("a listen address of 1 MB of x passed")
	}
	msg := err.Error()
	if len(msg) > 1024 || !strings.HasPrefix(msg, "big.toml:2: server.listen: ") || !strings.Contains(msg, "bytes)...") {
		t.Fatalf("error of %d bytes: %.300q", len(msg), msg)
	}
	// A made-up key as long (found by review: a 1 MB unknown key made a
	// 1 MB line).
	_, err = Parse([]byte("[server]\n"+strings.Repeat("k", 1<<20)+" = 1\n"), "big.toml")
	if err == nil || len(err.Error()) > 2048 || !strings.Contains(err.Error(), "unknown key") {
		t.Fatalf("unknown 1 MB key: error of %d bytes: %.300v", len(fmt.Sprint(err)), err)
	}
	// The count of bytes left out is exact, multi-byte characters cut at
	// either end included.
	long := strings.Repeat("é", 1000) // 2000 bytes
	out := elide(long)
	var n int
	if _, err := fmt.Sscanf(out[strings.Index(out, "...(")+4:], "%d", &n); err != nil || !utf8.ValidString(out) || len(long)-n != len(out)-len(fmt.Sprintf("...(%d bytes)...", n)) {
		t.Fatalf("elide: %d bytes elided, %q", n, out)
	}
}
