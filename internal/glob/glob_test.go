package glob

import (
	"context"
	"slices"
	"testing"

	"github.com/redproxy/redproxy/internal/redistest"
)

var globCases = []struct {
	pattern string
	key     string
	want    bool
}{
	{"*", "", true},
	{"*", "anything", true},
	{"session:*", "session:1", true},
	{"session:*", "session:", true},
	{"session:*", "session", false},
	{"session:*", "sessions:1", false},
	{"config", "config", true},
	{"config", "config2", false},
	{"a?c", "abc", true},
	{"a?c", "ac", false},
	{"*:v[0-9]*", "cache:v12:x", true},
	{"*:v[0-9]*", "cache:vx", false},
	{"[^a]*", "bc", true},
	{"[^a]*", "ac", false},
	{"[a-c]x", "bx", true},
	{"[c-a]x", "bx", true}, // Redis swaps reversed ranges
	{"[abc]", "d", false},
	{`a\*b`, "a*b", true},
	{`a\*b`, "axb", false},
	{`[\]]`, "]", true},
	{"*a*b*c", "xxaxxbxxc", true},
	{"*a*b*c", "xxaxxcxxb", false},
	{"a*", "a", true},
	{"**a", "ba", true},
	{"user:*:profile", "user:123:profile", true},
	{"user:*:profile", "user:123:settings", false},
	{"lock:?*", "lock:", false},
}

func TestGlob(t *testing.T) {
	for _, c := range globCases {
		g := Compile(c.pattern)
		if got := g.Match([]byte(c.key)); got != c.want {
			t.Errorf("%q ~ %q: got %v, want %v", c.pattern, c.key, got, c.want)
		}
		if got := Match(c.pattern, []byte(c.key)); got != c.want {
			t.Errorf("general matcher %q ~ %q: got %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
	if k := Compile("session:*").kind; k != globPrefix {
		t.Errorf("session:* compiled to kind %d, want prefix", k)
	}
	if k := Compile(`a\*`).kind; k != globFull {
		t.Errorf(`a\* must not be a prefix pattern`)
	}
}

// TestGlobMatchesRedis checks our matcher against real Redis SCAN MATCH on
// the same patterns and keys, so rule patterns mean what operators expect.
func TestGlobMatchesRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	var keys []string
	for _, c := range globCases {
		if c.key != "" && !slices.Contains(keys, c.key) {
			keys = append(keys, c.key)
		}
	}
	for _, k := range keys {
		if err := rdb.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range globCases {
		var redisMatches []string
		iter := rdb.Scan(ctx, 0, c.pattern, 1000).Iterator()
		for iter.Next(ctx) {
			redisMatches = append(redisMatches, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		g := Compile(c.pattern)
		for _, k := range keys {
			if ours, theirs := g.Match([]byte(k)), slices.Contains(redisMatches, k); ours != theirs {
				t.Errorf("pattern %q key %q: we say %v, Redis says %v", c.pattern, k, ours, theirs)
			}
		}
	}
}
