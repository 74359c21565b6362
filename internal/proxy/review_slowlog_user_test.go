package proxy_test

import (
	"strconv"
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

// An entry names the user and database its batch's first command ran
// as, not those a later AUTH or SELECT of the batch left (found by
// review: AUTH app, a slow EVAL, AUTH ro in one write was logged as ro's
// EVAL).
func TestSlowlogEntryKeepsItsFirstCommandsUser(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) {
		c.Server.SlowlogThreshold.Duration = 0 // every batch
	})
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"AUTH", "app", appPass}, "OK")
	wantReplies(t, c,
		[]string{"ECHO", "slow-first"}, []string{"SELECT", "3"}, []string{"AUTH", "ro", roPass},
		"slow-first", "OK", "OK")
	var got []string
	for _, e := range p.Slowlog().Entries() {
		if e.Command == "echo" && e.Batch == 3 {
			got = append(got, e.User+"/db"+strconv.Itoa(e.DB))
		}
	}
	if len(got) != 1 || got[0] != "app/db0" {
		t.Fatalf("slow log entries of the ECHO, SELECT, AUTH batch: %q; want [app/db0]", got)
	}
}
