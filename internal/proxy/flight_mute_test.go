package proxy_test

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// A read whose reply the client turned off (CLIENT REPLY OFF or SKIP)
// does not make its client the filler of a miss hold: the client never
// sees the nil, so it will not fill the key, and every other reader of it
// waited out the hold's timeout for nothing (found by review: 2 s each).
// Such a read goes to Redis as it is; the next reader that misses is the
// filler.
func TestMutedReadIsNoFiller(t *testing.T) {
	for _, tc := range []struct {
		mode string
		tier bool
	}{{"OFF", false}, {"SKIP", false}, {"OFF", true}, {"SKIP", true}} {
		mode := tc.mode
		name := mode
		if tc.tier {
			name += "_tier"
		}
		t.Run(name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) {
				c.Stampede.Hold = []stampede.HoldRule{{Pattern: "h:*", Timeout: units.Duration{Duration: time.Minute}}}
				if tc.tier {
					c.LocalCache.Enabled = true
					c.LocalCache.AdmitMinReads = 0 // every read a fill: the tier's held fill
				}
			})
			key := "h:muted:" + name
			commands := func() float64 { return metricSum(t, p, "redproxy_commands_total") }
			muted := dialRaw(t, p.Addr)
			before := commands()
			// One write each, so that the GET is a batch of its own, as
			// a read a hold may take.
			muted.send([]string{"CLIENT", "REPLY", mode})
			redistest.Eventually(t, 5*time.Second, func() bool { return commands() >= before+1 }, "CLIENT REPLY never counted")
			muted.send([]string{"GET", key})
			redistest.Eventually(t, 5*time.Second, func() bool { return commands() >= before+2 }, "GET never counted")
			if mode == "OFF" {
				wantReplies(t, muted, []string{"CLIENT", "REPLY", "ON"}, "OK")
			} else {
				wantReplies(t, muted, []string{"PING"}, "PONG")
			}
			// Not held behind the muted client (the hold is a minute).
			reader := dialRaw(t, p.Addr)
			if got := reader.do("GET", key); got != nil {
				t.Fatalf("GET %s = %#v, want a nil", key, got)
			}
		})
	}
}
