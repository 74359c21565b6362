package localcache

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// HotKey is one line of /debug/hotkeys.
type HotKey struct {
	DB  int    `json:"db"`
	Key string `json:"key"`
	// Reads and Writes are the sketch's estimates: a count of recent reads
	// (writes) that halves every admit_window, saturating at 256.
	Reads  uint64 `json:"reads"`
	Writes uint64 `json:"writes"`
	// ReadsPerSec is an estimate: from the sketch for keys read less than
	// the counters can hold, else from the hits the tier served.
	ReadsPerSec float64 `json:"reads_per_sec"`
	Cached      bool    `json:"cached"`
	Hits        int64   `json:"hits,omitempty"`  // served from the tier since cached (sampled)
	Bytes       int64   `json:"bytes,omitempty"` // charged against max_bytes
}

type hotCandidate struct {
	db  int
	key string
}

// noteCandidate remembers a key for /debug/hotkeys: one read on a miss that
// is no longer cold, or one of a sample of hits. Cold keys never get here,
// so the lock is off the pass-through path, and HotKeys looks only at these
// candidates instead of every cached key.
func (c *Cache) noteCandidate(db int, key []byte) {
	c.hotMu.Lock()
	last := &c.recent[(c.hotPos+len(c.recent)-1)%len(c.recent)]
	if last.db != db || last.key != string(key) {
		c.recent[c.hotPos%len(c.recent)] = hotCandidate{db: db, key: string(key)}
		c.hotPos++
	}
	c.hotMu.Unlock()
}

// HotKeys returns up to n of the hottest recently seen keys, cached or not,
// hottest first.
func (c *Cache) HotKeys(n int) []HotKey {
	now := nanotime()
	window := c.cfg.AdmitWindow.Duration.Seconds()
	c.hotMu.Lock()
	recent := c.recent
	c.hotMu.Unlock()
	seen := map[hotCandidate]bool{}
	var out []HotKey
	for _, hc := range recent {
		if hc.key == "" || seen[hc] {
			continue
		}
		seen[hc] = true
		h := c.hash(hc.db, []byte(hc.key))
		hk := HotKey{DB: hc.db, Key: hc.key, Reads: c.reads.estimate(h), Writes: c.writes.estimate(h)}
		// In steady state the decaying count sits between one and two
		// windows' worth of reads.
		hk.ReadsPerSec = float64(hk.Reads) / (1.5 * window)
		s := c.shardOf(h)
		s.mu.Lock()
		if rec := s.recs[h]; rec != nil && rec.key == hc.key && rec.db == hc.db && rec.n > 0 {
			hk.Cached = true
			hk.Hits = rec.hits.Load()
			hk.Bytes = rec.size + rec.keyCharge()
			if age := time.Duration(now - rec.since).Seconds(); age > 0 {
				hk.ReadsPerSec = max(hk.ReadsPerSec, float64(hk.Hits)/age)
			}
		}
		s.mu.Unlock()
		out = append(out, hk)
	}
	slices.SortFunc(out, func(a, b HotKey) int {
		switch {
		case a.ReadsPerSec > b.ReadsPerSec:
			return -1
		case a.ReadsPerSec < b.ReadsPerSec:
			return 1
		}
		return 0
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// HotKeysHandler serves /debug/hotkeys: the hottest keys as JSON, ?n=
// choosing how many (default 20).
func (c *Cache) HotKeysHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := 20
		if v := r.URL.Query().Get("n"); v != "" {
			// Refused as /debug/mirror's ?top= and /debug/slowlog's
			// ?limit= are, not taken for the default (a probe's ?n=abc got
			// 20 keys and no word of it).
			k, err := strconv.Atoi(v)
			if err != nil || k < 1 {
				http.Error(w, "n: want a number of keys, 1 or more (at most 1000 are listed), e.g. ?n=50", http.StatusBadRequest)
				return
			}
			n = min(k, 1000)
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			AdmitWindow string   `json:"admit_window"`
			Bytes       int64    `json:"bytes"`
			MaxBytes    int64    `json:"max_bytes"`
			Entries     int64    `json:"entries"`
			Keys        []HotKey `json:"keys"`
		}{c.cfg.AdmitWindow.String(), c.used.Load(), int64(c.cfg.MaxBytes), c.nentries.Load(), c.HotKeys(n)})
	})
}
