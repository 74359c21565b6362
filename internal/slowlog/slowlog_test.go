package slowlog

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestKeyPattern(t *testing.T) {
	for key, want := range map[string]string{
		"user:1234:profile":     "user:*:*",
		"cache:v2:product:789":  "cache:*:product:*",
		"session:alice":         "session:*",
		"mylist":                "*",
		"":                      "*",
		"a::b":                  "a:*:*",
		"myapp:session:abc123":  "myapp:session:*",
		"queue:jobs:pending":    "queue:jobs:*",
		"u:alice@example.com:x": "u:*:*",
		"order:3fa85f64-5717-4562-b3fc-2c963f66afa6:items": "order:*:*",
		"k:" + strings.Repeat("a", 33) + ":x":              "k:*:*",
	} {
		if got := KeyPattern([]byte(key)); got != want {
			t.Errorf("KeyPattern(%q) = %q, want %q", key, got, want)
		}
	}
	long := []byte(strings.Repeat("abc:", 1000))
	if got := KeyPattern(long); len(got) > maxPattern+2 {
		t.Errorf("pattern of a long key is %d bytes", len(got))
	}
}

func TestRingKeepsLastAndSortsSlowestFirst(t *testing.T) {
	l := New(3, time.Millisecond)
	for _, us := range []int64{50, 10, 40, 30, 20} {
		l.Add(Entry{TotalMicros: us})
	}
	got := l.Entries()
	var us []int64
	var ids []uint64
	for _, e := range got {
		us = append(us, e.TotalMicros)
		ids = append(ids, e.ID)
	}
	// The last three added were 40 (id 2), 30 (id 3), 20 (id 4).
	if len(got) != 3 || us[0] != 40 || us[1] != 30 || us[2] != 20 || ids[0] != 2 || ids[2] != 4 {
		t.Fatalf("entries %v ids %v", us, ids)
	}
	if l.Total() != 5 || l.Len() != 3 {
		t.Fatalf("total %d, len %d", l.Total(), l.Len())
	}
	// After a reset the oldest entry is still the one replaced.
	l.Reset()
	if l.Len() != 0 || l.Total() != 5 {
		t.Fatalf("after a reset: len %d, total %d", l.Len(), l.Total())
	}
	for _, us := range []int64{1, 2, 3, 4} {
		l.Add(Entry{TotalMicros: us})
	}
	us = us[:0]
	for _, e := range l.Entries() {
		us = append(us, e.TotalMicros)
	}
	if len(us) != 3 || us[0] != 4 || us[1] != 3 || us[2] != 2 {
		t.Fatalf("after a reset: %v", us)
	}
	off := New(0, 0)
	off.Add(Entry{TotalMicros: 1})
	if len(off.Entries()) != 0 || off.Total() != 0 {
		t.Fatal("a log of length 0 kept an entry")
	}
}

func TestHandler(t *testing.T) {
	l := New(8, 10*time.Millisecond)
	for i := range 5 {
		l.Add(Entry{TotalMicros: int64(i), Command: "get"})
	}
	h := l.Handler()
	do := func(method, target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
		return rec
	}
	rec := do("GET", "/debug/slowlog?limit=2")
	var rep Report
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil || rec.Code != 200 {
		t.Fatalf("%d %v %s", rec.Code, err, rec.Body)
	}
	if rep.ThresholdMicros != 10000 || rep.MaxLen != 8 || rep.Total != 5 || len(rep.Entries) != 2 || rep.Entries[0].TotalMicros != 4 {
		t.Fatalf("%+v", rep)
	}
	if rec := do("GET", "/debug/slowlog?limit=x"); rec.Code != http.StatusBadRequest {
		t.Fatalf("bad limit: %d", rec.Code)
	}
	if rec := do("POST", "/debug/slowlog"); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") == "" {
		t.Fatalf("POST: %d", rec.Code)
	}
	if rec := do("DELETE", "/debug/slowlog"); rec.Code != http.StatusNoContent || len(l.Entries()) != 0 {
		t.Fatalf("DELETE: %d, %d entries left", rec.Code, len(l.Entries()))
	}
}
