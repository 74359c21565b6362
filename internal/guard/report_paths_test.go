package guard_test

import (
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// Under --policy-mode=report every command the rules would refuse is
// reported, so that staging shows what enforce will refuse. Violations were
// recorded only where the guard's decision was applied (guardStep, a
// refusal, the blocking and relay paths), so the commands the proxy handles
// itself before that (SCRIPT KILL runs alone, MONITOR and SUBSCRIBE start a
// relay) never reached /policy/report: staging showed a clean report, and
// production then refused them. Each row must also count its command once,
// whichever path handled it.
func TestReportModeRecordsProxyHandledCommands(t *testing.T) {
	pol := policy.Config{Mode: "report", Commands: policy.CommandRules{
		Deny: []string{"monitor", "subscribe", "script|kill", "dbsize", "blpop"},
	}}
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = pol })
	nc := p.Dial(t)
	if got := roundTrip(t, nc, []string{"SCRIPT", "KILL"}); !strings.HasPrefix(got[0], "-NOTBUSY") {
		t.Fatalf("SCRIPT KILL: %q", got)
	}
	equalReplies(t, roundTrip(t, nc, []string{"DBSIZE"}, []string{"BLPOP", "s:none", "0.01"}), []string{":0", "*(nil)"})
	mon := p.Dial(t)
	equalReplies(t, roundTrip(t, mon, []string{"MONITOR"}), []string{"+OK"})
	sub := p.Dial(t)
	equalReplies(t, roundTrip(t, sub, []string{"SUBSCRIBE", "ch"}), []string{"*[$subscribe $ch :1]"})

	// A violation is recorded before its command is forwarded, so it is in
	// the report by the time the reply is read: no wait.
	rep := reportJSON(t, p.Guard())
	for _, name := range []string{"script|kill", "dbsize", "blpop", "monitor", "subscribe"} {
		row := findRow(rep, policy.RuleCommand, name)
		switch {
		case row == nil:
			t.Errorf("%s under report mode is missing from /policy/report: %+v", name, rep.Rows)
		case row.Count != 1 || row.Reported != 1:
			t.Errorf("%s sent once, reported as %+v", name, *row)
		}
	}
}
