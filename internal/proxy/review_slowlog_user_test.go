package proxy_test

import (
	"testing"

	"github.com/redproxy/redproxy/internal/config"
)

// The slow log (/debug/slowlog) promises each entry's user: with proxy
// users it records the upstream credential's user ("default") for every
// client, never the proxy user that ran the batch.
func TestReviewSlowlogRecordsProxyUser(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) {
		c.Server.SlowlogThreshold.Duration = 0 // every batch
	})
	c := dialRaw(t, p.Addr)
	if v := c.do("AUTH", "ro", roPass); v != "OK" {
		t.Fatalf("AUTH ro = %v", v)
	}
	if v := c.do("GET", "cache:review-slowlog"); v != nil {
		t.Fatalf("GET = %v", v)
	}
	var users []string
	found := false
	for _, e := range p.Slowlog().Entries() {
		if e.Command == "get" {
			users = append(users, e.User)
			if e.User == "ro" {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("slow log entries for the GET run as proxy user ro name users %q; want \"ro\"", users)
	}
}
