package policy

import (
	"slices"
	"testing"
)

// A TTL requirement that only the batch's end left unmet, refused (no
// default) or reported, is open (Decision.Open): a transaction typed
// command by command may still settle it. Anything else refusing the
// request, or a boundary after the write, closes it.
func TestOpenRequirements(t *testing.T) {
	p := compileDoc(t, ttlDoc+`
[policy.names]
max_key_length = 10
`)
	cases := []struct {
		name  string
		batch []string
		req   int
		open  []string // the open violations' keys
		sum   string
	}{
		{"alone", []string{"SET l:1 v"}, 0, []string{"l:1"}, "refused:ttl"},
		{"after multi", []string{"MULTI", "HSET l:1 f v"}, 1, []string{"l:1"}, "refused:ttl"},
		{"a boundary after it", []string{"SET l:1 v", "SELECT 0"}, 0, nil, "refused:ttl"},
		{"exec after it", []string{"MULTI", "SET l:1 v", "EXEC"}, 1, nil, "refused:ttl"},
		{"two keys", []string{"MSET l:1 v l:2 v"}, 0, []string{"l:1", "l:2"}, "refused:ttl refused:ttl"},
		// The default key's fix is kept with the open refusal: forwarded
		// in a transaction, the write needs it.
		{"beside a fixed key", []string{"MSET s:1 v l:1 v"}, 0, []string{"s:1", "l:1"}, "fixed:ttl refused:ttl expire=[s:1 86400]"},
		// Fixed at once outside a transaction; open in one.
		{"a default", []string{"SET s:1 v"}, 0, []string{"s:1"}, "fixed:ttl args=[SET s:1 v EX 86400]"},
		{"a default behind a boundary", []string{"SET s:1 v", "SELECT 0"}, 0, nil, "fixed:ttl args=[SET s:1 v EX 86400]"},
		{"an explicit ttl clamped is no requirement", []string{"SET s:1 v EX 999999999"}, 0, nil, "fixed:ttl_max args=[SET s:1 v EX 604800]"},
		{"report mode", []string{"HSET r:1 f v"}, 0, []string{"r:1"}, "reported:ttl"},
		{"a name refusal first", []string{"SET l:toolongname v"}, 0, nil, "refused:max_key_length"},
		{"a name refusal after", []string{"MSET l:1 v l:toolongname v"}, 0, nil, "refused:max_key_length"},
		{"settled in the batch", []string{"SET l:1 v", "EXPIRE l:1 30"}, 0, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := checkBatch(t, p, batch(c.batch...))[c.req]
			var open []string
			for _, o := range d.Open {
				open = append(open, string(d.Violations[o.V].Key))
			}
			if !slices.Equal(open, c.open) || summary(d) != c.sum {
				t.Fatalf("open %q %q, want %q %q", open, summary(d), c.open, c.sum)
			}
			if len(c.open) > 0 && !d.CutOff {
				t.Errorf("open but not CutOff")
			}
		})
	}
}

// A fixed requirement is open only when everything on the request is:
// forwarded as sent, the request would lose any other fix or report.
func TestOpenFixedOnlyAlone(t *testing.T) {
	p := compileDoc(t, ttlDoc+`
[policy.names]
action = "report"
max_key_length = 10
`)
	d := checkBatch(t, p, batch("MSET s:1 v s:toolongname v"))[0]
	if len(d.Open) != 0 || summary(d) != "reported:max_key_length fixed:ttl fixed:ttl expire=[s:1 86400] expire=[s:toolongname 86400]" {
		t.Fatalf("open %v, %s", d.Open, summary(d))
	}
	d = checkBatch(t, p, batch("MSET s:1 v l:1 v s:toolongname v"))[0]
	if len(d.Open) != 1 || string(d.Violations[d.Open[0].V].Key) != "l:1" || d.Refuse == nil {
		t.Fatalf("a refused requirement beside a report: open %v, %s", d.Open, summary(d))
	}
}

// CheckTx settles a requirement carried from an earlier batch of the
// transaction with a request of this one that certainly sets the key's
// TTL before any boundary, and closes the rest at a boundary.
func TestCheckTxSettles(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	open := [][]byte{[]byte("l:1"), []byte("l:2")}
	cases := []struct {
		name    string
		batch   []string
		settled []bool
		closed  bool
	}{
		{"expire", []string{"EXPIRE l:1 30"}, []bool{true, false}, false},
		{"both", []string{"PEXPIRE l:2 30000", "SET l:1 v EX 30"}, []bool{true, true}, false},
		{"then exec", []string{"EXPIRE l:2 30", "EXEC"}, []bool{false, true}, true},
		{"exec alone", []string{"EXEC"}, []bool{false, false}, true},
		{"behind a select", []string{"SELECT 0", "EXPIRE l:1 30"}, []bool{false, false}, true},
		{"xx may set nothing", []string{"EXPIRE l:1 30 XX"}, []bool{false, false}, false},
		{"zero deletes", []string{"EXPIRE l:1 0"}, []bool{false, false}, false},
		{"over the max, refused", []string{"EXPIRE l:1 3600"}, []bool{false, false}, false},
		{"another key", []string{"EXPIRE l:3 30"}, []bool{false, false}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			settled := make([]bool, len(open))
			_, closed := p.CheckTx(batch(c.batch...), nil, open, settled)
			if !slices.Equal(settled, c.settled) || closed != c.closed {
				t.Fatalf("settled %v closed %v, want %v %v", settled, closed, c.settled, c.closed)
			}
		})
	}
	var nilPolicy *Policy
	settled := make([]bool, len(open))
	if _, closed := nilPolicy.CheckTx(batch("EXPIRE l:1 30", "EXEC"), nil, open, settled); !closed || settled[0] {
		t.Errorf("no policy: settled %v closed %v", settled, closed)
	}
}

// UnderEnforce says what enforce does with a violation only reported now:
// the rule's own action with policy.mode enforce and no --policy-mode cap.
// A rule whose own action is report, or a scope whose own mode is, keeps
// reporting; a default or a clamp fixes; the rest refuse.
func TestUnderEnforce(t *testing.T) {
	doc := `
[policy]
mode = "report"
[[policy.ttl]]
pattern = "s:*"
required = true
default = "1h"
max = "2h"
[[policy.ttl]]
pattern = "l:*"
required = true
[[policy.ttl]]
pattern = "r:*"
required = true
action = "report"
[[policy.scope]]
name = "batch"
users = ["batch"]
mode = "report"
`
	p := compileDoc(t, doc)
	cases := []struct {
		cmd, user string
		want      Outcome
	}{
		{"HSET s:1 f v", "", Fixed},
		{"SET s:1 v EX 99999", "", Fixed},
		{"HSET l:1 f v", "", Refused},
		{"HSET r:1 f v", "", Reported},
		{"KEYS *", "", Refused},
		{"HSET l:1 f v", "batch", Reported},
	}
	for _, c := range cases {
		req := line(c.cmd)
		req.User = c.user
		d := checkBatch(t, p, []Request{req})[0]
		if len(d.Violations) != 1 || d.Violations[0].Outcome != Reported || d.Violations[0].UnderEnforce != c.want {
			t.Errorf("%s (user %q): %+v, want one reported, %s under enforce", c.cmd, c.user, d.Violations, c.want)
		}
	}
}
