package faultsuite

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// strModel is what one client knows about a string key only it writes:
// the value its last acknowledged write (or last read) established, and
// writes whose outcome it never learned.
type strModel struct {
	cur     string
	curNil  bool
	curSent time.Time // when the write that produced cur was sent
	curAck  time.Time // when cur was acknowledged or read
	maybes  []maybeWrite
}

// maybeWrite is a write that got an error or no reply: Redis may or may
// not have run it, possibly a little later (see lateWindow).
type maybeWrite struct {
	val         string
	sent, errAt time.Time
}

func newStrModel(initial string) strModel {
	if initial == "" {
		return strModel{curNil: true}
	}
	return strModel{cur: initial}
}

func (m *strModel) acked(v string, sent, now time.Time) {
	m.cur, m.curNil, m.curSent, m.curAck = v, false, sent, now
	m.maybes = slices.DeleteFunc(m.maybes, func(w maybeWrite) bool { return !m.possible(w) })
}

func (m *strModel) maybe(v string, sent, now time.Time) {
	m.maybes = append(m.maybes, maybeWrite{val: v, sent: sent, errAt: now})
}

// possible reports whether w may have landed after cur: it was sent after
// cur was known, or it may have run late, after the write that made cur.
func (m *strModel) possible(w maybeWrite) bool {
	return w.sent.After(m.curAck) || !w.errAt.Add(lateWindow).Before(m.curSent)
}

// observe reports whether a read may return got (isNil: the key is
// missing), and if so makes it the current value.
func (m *strModel) observe(got string, isNil bool, now time.Time) bool {
	if isNil {
		return m.curNil // nothing in the suite deletes a key
	}
	if !m.curNil && got == m.cur {
		return true
	}
	for i, w := range m.maybes {
		if w.val == got && m.possible(w) {
			m.maybes = slices.Delete(m.maybes, i, i+1)
			m.cur, m.curNil, m.curSent, m.curAck = got, false, w.sent, now
			m.maybes = slices.DeleteFunc(m.maybes, func(w maybeWrite) bool { return !m.possible(w) })
			return true
		}
	}
	return false
}

func (m *strModel) String() string {
	var b strings.Builder
	if m.curNil {
		b.WriteString("nil")
	} else {
		fmt.Fprintf(&b, "%q", m.cur)
	}
	if len(m.maybes) > 0 {
		b.WriteString(" or maybe")
		// The newest few are the ones that matter in a report.
		from := max(0, len(m.maybes)-4)
		if from > 0 {
			fmt.Fprintf(&b, " (%d older)", from)
		}
		for _, w := range m.maybes[from:] {
			fmt.Fprintf(&b, " %q", w.val)
		}
	}
	return b.String()
}

// counterModel is a counter only one client increments: lo is the last
// value it saw, and up to maybe increments it sent may have run unseen.
type counterModel struct {
	lo, maybe int64
}

// next reports whether INCR may answer n, and adopts n.
func (m *counterModel) next(n int64) bool {
	if n < m.lo+1 || n > m.lo+1+m.maybe {
		return false
	}
	m.maybe -= n - m.lo - 1
	m.lo = n
	return true
}

// holds reports whether Redis may hold n at the end.
func (m *counterModel) holds(n int64) bool { return n >= m.lo && n <= m.lo+m.maybe }

func (m *counterModel) String() string {
	if m.maybe == 0 {
		return fmt.Sprintf("%d", m.lo)
	}
	return fmt.Sprintf("%d..%d", m.lo, m.lo+m.maybe)
}
