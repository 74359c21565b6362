package cluster

import (
	"context"
	"fmt"
	"testing"

	"github.com/redproxy/redproxy/internal/redistest"
)

func TestSlotKnownValues(t *testing.T) {
	// Values from the Redis Cluster specification and redis-cli.
	for key, want := range map[string]int{
		"":            0,
		"123456789":   0x31C3 & (Slots - 1),
		"foo":         12182,
		"{user1000}a": Slot([]byte("user1000")),
		"foo{}{bar}":  Slot([]byte("foo{}{bar}")),
		"foo{{bar}}":  Slot([]byte("{bar")),
		"foo{bar}{z}": Slot([]byte("bar")),
	} {
		if got := Slot([]byte(key)); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestSlotMatchesRedis compares Slot with CLUSTER KEYSLOT of a real
// cluster node for keys with and without hash tags, odd bytes included.
func TestSlotMatchesRedis(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	rc := c.Nodes[0].Client(t)
	ctx := context.Background()
	keys := []string{"", "{", "}", "{}", "}{", "{a", "a}", "{}a", "a{}", "{a}{b}", "a{b}c{d}", "\x00\xff{\x80}", "{{}}", "{{a}}"}
	for i := range 2000 {
		keys = append(keys, fmt.Sprintf("key:%d", i), fmt.Sprintf("{user%d}:cart", i%97), fmt.Sprintf("x{%d}", i), string([]byte{byte(i), byte(i >> 8), '{', byte(i * 7), '}'}))
	}
	pipe := rc.Pipeline()
	cmds := make([]interface{ Val() int64 }, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.ClusterKeySlot(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got, want := Slot([]byte(k)), int(cmds[i].Val()); got != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// TestKeyInSlot: the proxy's key for a slot hashes to that slot, for every
// slot (WAIT's marker depends on it).
func TestKeyInSlot(t *testing.T) {
	for s := range Slots {
		k := KeyInSlot("__redproxy__:wait-mark:", s)
		if got := Slot([]byte(k)); got != s {
			t.Fatalf("KeyInSlot(%d) = %q, in slot %d", s, k, got)
		}
	}
}
