package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A subscriber that keeps lagging above the pub/sub soft limit, never
// reaching the hard one, is closed once it has stayed above for the soft
// time, as by Redis's client-output-buffer-limit pubsub soft limit (found
// by a probe: one 12-20 MB behind for 100 s was never closed, where Redis
// closed it after 60 s). 16 MB is published at it, half the hard limit,
// more than the kernel's socket buffers take; then a message now and then
// to be checked against the soft time.
func TestSubscriberOverTheSoftLimitIsClosed(t *testing.T) {
	srv := redistest.Start(t)
	p := proxytest.Start(t, srv, func(c *config.Config) {
		c.Server.PubSubOutputLimit = 32 * units.MB
		c.Server.PubSubOutputSoftLimit = 256 * units.KB
		c.Server.PubSubOutputSoftTime.Duration = 200 * time.Millisecond
	})
	sub := dialRaw(t, p.Addr)
	sub.send([]string{"SUBSCRIBE", "lagging"})
	if v, _ := sub.readReply(); len(v.([]any)) != 3 {
		t.Fatalf("SUBSCRIBE: %#v", v)
	}
	// It reads nothing more.
	direct := srv.Client(t)
	msg := strings.Repeat("m", 64<<10)
	for range 256 {
		if err := direct.Publish(ctx, "lagging", msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	closedForOutput := func() bool {
		direct.Publish(ctx, "lagging", "tick")
		return closeCounts(p)[metrics.CloseOutputLimit] == 1
	}
	redistest.Eventually(t, 20*time.Second, closedForOutput,
		"the subscriber left 16 MB behind (soft limit 256 KB, 200 ms) was not closed: closes %v", closeCounts(p))
	redistest.Eventually(t, 5*time.Second, func() bool {
		n, _ := direct.PubSubNumSub(ctx, "lagging").Result()
		return n["lagging"] == 0
	}, "the subscriber's connection to Redis stayed subscribed")
}

// A RESP3 client that turned tracking on and then subscribed is in
// Redis's pub/sub class: never closed for idleness, and under the pub/sub
// output limits (found by a probe: its relay, a tracking one, closed it at
// idle_timeout and had no soft limit).
func TestTrackingClientThatSubscribesIsASubscriber(t *testing.T) {
	srv := redistest.Start(t)
	p := proxytest.Start(t, srv, func(c *config.Config) {
		c.Server.IdleTimeout.Duration = 300 * time.Millisecond
		c.Server.PubSubOutputSoftLimit = 256 * units.KB
		c.Server.PubSubOutputSoftTime.Duration = 200 * time.Millisecond
	})
	sub := dialRaw(t, p.Addr)
	sub.send([]string{"HELLO", "3"})
	sub.readReply()
	sub.send([]string{"CLIENT", "TRACKING", "ON"})
	if v, _ := sub.readReply(); v != "OK" {
		t.Fatalf("CLIENT TRACKING ON: %#v", v)
	}
	sub.send([]string{"SUBSCRIBE", "tracked:ch"})
	sub.readReply()
	time.Sleep(time.Second) // idle for three idle_timeouts, as a quiet subscriber is
	direct := srv.Client(t)
	if n, err := direct.Publish(ctx, "tracked:ch", "still there").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH after the subscriber was quiet for 1 s: %d receivers, %v (closed for idleness?)", n, err)
	}
	if v, _ := sub.readReply(); fmt.Sprint(v) != "[message tracked:ch still there]" {
		t.Fatalf("the quiet subscriber got %#v", v)
	}
	// And it reads nothing more: the soft limit closes it.
	msg := strings.Repeat("m", 64<<10)
	for range 256 {
		if err := direct.Publish(ctx, "tracked:ch", msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	redistest.Eventually(t, 20*time.Second, func() bool {
		direct.Publish(ctx, "tracked:ch", "tick")
		return closeCounts(p)[metrics.CloseOutputLimit] == 1
	}, "the lagging subscriber was not closed for its output: closes %v", closeCounts(p))
}
