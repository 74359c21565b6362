package redistest

import (
	"context"
	"testing"
)

func TestStartCluster(t *testing.T) {
	c := StartCluster(t, 3, 1)
	if got := len(c.Primaries(t)); got != 3 {
		t.Fatalf("primaries = %d, want 3", got)
	}
	if got := len(c.Replicas(t)); got != 3 {
		t.Fatalf("replicas = %d, want 3", got)
	}
	cc := c.ClusterClient(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "{user1}x"} {
		if err := cc.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		if v, err := cc.Get(ctx, k).Result(); err != nil || v != k {
			t.Fatalf("GET %s = %q, %v", k, v, err)
		}
	}
}
