package commands

import (
	"context"
	"reflect"
	"sort"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// important are the commands whose facts the proxy's routing and guard rely on;
// Load and Builtin must agree on them whatever the server version.
var important = []string{
	"get", "set", "del", "mget", "mset", "rename", "lmove", "copy", "expire", "incr",
	"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro",
	"xread", "xreadgroup", "zunion", "zunionstore", "zinter", "zinterstore", "zdiff", "zdiffstore",
	"sintercard", "zintercard", "lmpop", "blmpop", "zmpop", "bzmpop", "sort", "sort_ro", "migrate",
	"georadius", "georadiusbymember", "blpop", "brpop", "blmove", "brpoplpush", "bzpopmin", "bzpopmax",
	"wait", "subscribe", "publish", "multi", "exec", "watch", "select", "keys", "flushall",
	"client|setname", "client|tracking", "config|get", "config|set", "script|load", "object|encoding",
}

func TestLoadMatchesBuiltin(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	// go-redis speaks RESP3 by default (maps and sets); also load over RESP2
	// (flat arrays) since the upstream pool may use either.
	clients := map[string]*redis.Client{"resp3": srv.Client(t)}
	resp2 := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = resp2.Close() })
	clients["resp2"] = resp2

	version, err := srv.Client(t).InfoMap(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	sameVersion := version["Server"]["redis_version"] == BuiltinRedisVersion
	builtin := Builtin()

	for proto, c := range clients {
		t.Run(proto, func(t *testing.T) {
			loaded, err := Load(ctx, c)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			for _, name := range important {
				l, b := loaded.Get(name), builtin.Get(name)
				if l == nil || b == nil {
					t.Errorf("%s: loaded %v, builtin %v", name, l, b)
					continue
				}
				compareCommand(t, l, b)
			}
			for _, tc := range keyCases {
				args := argv(tc.cmd)
				if got := loaded.Lookup(args).Keys(args, nil); !equalInts(got, tc.want) {
					t.Errorf("loaded Keys(%q) = %v, want %v", tc.cmd, got, tc.want)
				}
			}
			if !sameVersion {
				t.Logf("server is %s, builtin is %s: compared important commands only",
					version["Server"]["redis_version"], BuiltinRedisVersion)
				return
			}
			// Same server version as the generator saw: the whole table must match.
			if loaded.Len() != builtin.Len() {
				t.Errorf("loaded %d commands, builtin %d", loaded.Len(), builtin.Len())
			}
			for _, b := range allCommands(builtin) {
				l := loaded.Get(b.Name)
				if l == nil {
					t.Errorf("%s missing from loaded table", b.Name)
					continue
				}
				compareCommand(t, l, b)
			}
		})
	}
}

func compareCommand(t *testing.T, l, b *Command) {
	t.Helper()
	if l.Name != b.Name || l.Arity != b.Arity || l.Flags != b.Flags {
		t.Errorf("%s: loaded (%s, %d, %v) != builtin (%s, %d, %v)", b.Name, l.Name, l.Arity, l.Flags, b.Name, b.Arity, b.Flags)
	}
	if l.FirstKey != b.FirstKey || l.LastKey != b.LastKey || l.KeyStep != b.KeyStep {
		t.Errorf("%s: legacy key positions differ", b.Name)
	}
	if !reflect.DeepEqual(l.KeySpecs, b.KeySpecs) {
		t.Errorf("%s: key specs differ:\nloaded  %+v\nbuiltin %+v", b.Name, l.KeySpecs, b.KeySpecs)
	}
	if !reflect.DeepEqual(subNames(l), subNames(b)) {
		t.Errorf("%s: subcommands differ: %v vs %v", b.Name, subNames(l), subNames(b))
	}
	if l.keysProc != b.keysProc || l.block != b.block {
		t.Errorf("%s: derived behaviour differs", b.Name)
	}
}

func subNames(c *Command) []string {
	var out []string
	for k := range c.Subcommands {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestKeysMatchRedis asks a real server which arguments are keys (COMMAND
// GETKEYS) for every call Redis accepts, and checks Keys agrees.
func TestKeysMatchRedis(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := srv.Client(t)
	tab := Builtin()
	withKeys := 0
	for _, tc := range keyCases {
		if !tc.valid {
			continue
		}
		args := argv(tc.cmd)
		cmdArgs := []any{"COMMAND", "GETKEYS"}
		for _, a := range args {
			cmdArgs = append(cmdArgs, string(a))
		}
		res, err := c.Do(ctx, cmdArgs...).StringSlice()
		var want []string
		if err == nil {
			want = res
		} else if len(tc.want) > 0 {
			// Redis errors when a command has no key arguments in this call;
			// any other error means the case is not actually valid.
			t.Errorf("COMMAND GETKEYS %s: %v", tc.cmd, err)
			continue
		}
		var got []string
		for _, i := range tab.Lookup(args).Keys(args, nil) {
			got = append(got, string(args[i]))
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q: Keys gives %q, Redis says %q", tc.cmd, got, want)
		}
		if len(want) > 0 {
			withKeys++
		}
	}
	if withKeys < 50 {
		t.Errorf("only %d calls cross-checked with keys; the comparison is too thin", withKeys)
	}
}
