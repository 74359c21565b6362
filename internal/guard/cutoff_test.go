package guard_test

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
)

// CutOffActs: a write cut off from its EXPIRE by the batch's end counts
// when the client would notice (enforce: a fix-up or a refusal), not when
// the policy only reports it; the session waits briefly for the rest of a
// write that came in pieces only then (Session.extendBatch).
func TestCutOffActsOnlyWhereTheClientNotices(t *testing.T) {
	for _, tc := range []struct {
		mode string
		cmd  []string
		acts bool
	}{
		{"enforce", []string{"INCR", "s:c"}, true},        // fix-up
		{"enforce", []string{"SET", "l:lock", "v"}, true}, // refusal
		{"report", []string{"INCR", "s:c"}, false},
		{"enforce", []string{"GET", "s:c"}, false},
	} {
		p, err := policy.Compile(policy.Config{Mode: tc.mode, TTL: []policy.TTLRule{
			{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: time.Hour}},
			{Pattern: "l:*", Required: true},
		}})
		if err != nil {
			t.Fatal(err)
		}
		var b guard.Batch
		args := make([][]byte, len(tc.cmd))
		for i, a := range tc.cmd {
			args[i] = []byte(a)
		}
		b.Prepare(p, commands.Builtin(), []resp.Request{{Args: args}}, "default", "plain", nil)
		if got := b.CutOffActs(); got != tc.acts {
			t.Errorf("%s %q: CutOffActs %v (CutOff %v), want %v", tc.mode, tc.cmd, got, b.CutOff(), tc.acts)
		}
	}
}
