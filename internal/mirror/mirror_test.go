package mirror

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/upstream"
)

var ping = []byte("*1\r\n$4\r\nPING\r\n")

// TestEnqueueBounds: the queue takes batches up to its limits and drops
// the rest, whole, with the reason counted, without the sender taking
// anything (its dial is held); what is still queued at Close is counted as
// dropped at shutdown, and nothing is queued after.
func TestEnqueueBounds(t *testing.T) {
	release := make(chan struct{})
	addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	m := New(Options{
		Config:    Config{Upstream: "new", Writes: true, Queue: 3, QueueBytes: units.KB},
		Databases: 16,
		Dial: func(<-chan struct{}) Target {
			<-release
			return BackendTarget(upstream.NewBackend(upstream.BackendOptions{Addr: addr, Connections: 1, Databases: 16,
				DialTimeout: 10 * time.Millisecond, ReplyTimeout: time.Second, ReconnectMin: time.Millisecond, ReconnectMax: time.Millisecond}), nil)
		},
	})
	var b Batch
	enqueue := func(db, cmds int, size int) {
		t.Helper()
		for range cmds {
			b.Write("ping", false, ping)
		}
		if size > 0 {
			b.Write("set", false, []byte(strings.Repeat("x", size)))
		}
		m.Enqueue(db, false, &b)
		b.Reset()
	}
	enqueue(0, 2, 0)
	enqueue(0, 2, 0) // 4 > 3 commands: dropped whole
	enqueue(1, 1, 0)
	enqueue(0, 1, 0) // full
	enqueue(16, 1, 0)
	enqueue(0, 0, 2*int(units.KB))
	if n, bytes := m.Queued(); n != 3 || bytes <= 0 || bytes > int64(units.KB) {
		t.Fatalf("queued %d commands, %d bytes; want 3 within 1KB", n, bytes)
	}
	want := map[string]int64{DropQueueFull: 3, DropDBRange: 1, DropTooLarge: 1, DropShutdown: 0, DropUnavailable: 0, DropNoScript: 0, DropCrossSlot: 0}
	if got := m.Report(0).Dropped; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dropped %v, want %v", got, want)
	}
	closed := make(chan struct{})
	go func() { m.Close(); close(closed) }()
	redistest.Eventually(t, 5*time.Second, func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.closed }, "Close never began")
	close(release)
	<-closed
	enqueue(0, 1, 0)
	r := m.Report(0)
	if r.Dropped[DropShutdown] != 4 || r.Queued != 0 || r.QueuedBytes != 0 || r.Sent != 0 {
		t.Fatalf("after Close: %+v; want 4 dropped at shutdown, nothing queued or sent", r)
	}
}

// TestPatternsCapped: mismatches are counted by key pattern, at most
// maxPatterns of them, the rest under OtherPattern; top lists the most
// first.
func TestPatternsCapped(t *testing.T) {
	var p patterns
	p.m = map[string]*patternStat{}
	for i := range maxPatterns + 10 {
		p.add(fmt.Sprintf("p%d:*", i), "get")
	}
	p.add("p0:*", "hget")
	if len(p.m) != maxPatterns+1 {
		t.Fatalf("%d patterns kept, want %d", len(p.m), maxPatterns+1)
	}
	top := p.top(2)
	if len(top) != 2 || top[0] != (PatternCount{Pattern: OtherPattern, Command: "get", Mismatches: 10}) ||
		top[1] != (PatternCount{Pattern: "p0:*", Command: "hget", Mismatches: 2}) {
		t.Fatalf("top = %+v", top)
	}
}

// TestConfigValidate: the section's own checks.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.ReadsSample = -0.1
	c.Queue = MaxQueue + 1
	c.QueueBytes = 5 * units.GB
	err := c.Validate()
	for _, key := range []string{"mirror.reads_sample", "mirror.queue:", "mirror.queue_bytes"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate = %v; want %s", err, key)
		}
	}
	if c := (Config{Upstream: "new"}); c.Enabled() {
		t.Error("a mirror with neither writes nor reads is enabled")
	}
}
