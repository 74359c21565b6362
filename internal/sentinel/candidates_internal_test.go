package sentinel

import "testing"

// The probe's run: two failovers in a row (37001 to 37002 at epoch 70,
// 37002 to 37003 at 71). The proxy had taken 37002 at epoch 71 from a
// Sentinel answer whose address was read before its switch and whose
// epoch after it; once every Sentinel named 37003 at epoch 71, the equal
// epoch kept the proxy on 37002, which still answered as a primary until
// the Sentinels demoted it 7.5 s later, and writes taken there were lost.
func TestCandidatesLeaveAPrimaryNoSentinelNamesAtItsEpoch(t *testing.T) {
	answers := []*answer{{addr: "127.0.0.1:37003", epoch: 71, votes: 3}}
	cands, _ := candidates(answers, 3, "127.0.0.1:37002", 71, false, false, false, false)
	if len(cands) == 0 || cands[0].addr != "127.0.0.1:37003" {
		t.Fatalf("candidates %v: want the server every Sentinel names at the epoch in use tried first", cands)
	}
}

// What the rule must still keep: the primary in use while a Sentinel
// names it at its epoch, or while none names a newer one; and an adopted
// promotion, whose made-up epoch may equal the Sentinels', while it is
// provisional.
func TestCandidatesKeepThePrimaryInUse(t *testing.T) {
	const cur, other = "127.0.0.1:1", "127.0.0.1:2"
	for _, c := range []struct {
		name        string
		answers     []*answer
		epoch       int64
		provisional bool
		named       bool
	}{
		{"named at its epoch", []*answer{{addr: other, epoch: 5, votes: 2}, {addr: cur, epoch: 5, votes: 1}}, 5, false, true},
		{"no newer epoch named", []*answer{{addr: other, epoch: 4, votes: 3}}, 5, false, false},
		{"provisional at an equal epoch", []*answer{{addr: other, epoch: 5, votes: 3}}, 5, true, false},
		// The watcher's first check after Start runs at epoch -1; so do
		// Sentinels that cannot be asked their epoch.
		{"no epoch on either side", []*answer{{addr: other, epoch: -1, votes: 2}}, -1, false, false},
		{"no answer, no epoch", nil, -1, false, false},
	} {
		cands, overruled := candidates(c.answers, 3, cur, c.epoch, c.provisional, c.named, false, false)
		if len(cands) == 0 || cands[0].addr != cur || overruled {
			t.Errorf("%s: candidates %v (overruled %v): want the primary in use first", c.name, cands, overruled)
		}
	}
	// A newer epoch naming another server moves the proxy, named or not.
	cands, _ := candidates([]*answer{{addr: other, epoch: 6, votes: 1}, {addr: cur, epoch: 5, votes: 2}}, 3, cur, 5, false, true, false, false)
	if cands[0].addr != other {
		t.Errorf("a newer epoch: candidates %v, want %s first", cands, other)
	}
}
