// Package slowlog keeps the proxy's slow log: the last N client batches
// that took longer than a threshold, with how that time split between the
// proxy and Redis. It is Redis's SLOWLOG seen from the proxy: Redis's own
// slow log times only command execution, so a command that queued behind a
// busy shared connection, waited on a coalesced fetch or a miss hold, or was
// slowed by the proxy itself, shows up here and nowhere else.
//
// Entries never hold values: a command is named by its command name and the
// pattern of its first key (see KeyPattern), and the client by its address
// and user.
package slowlog

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Entry is one slow batch. A pipelined batch is one entry, named by its
// first command, because its commands share one trip to Redis and one
// timing.
type Entry struct {
	ID   uint64    `json:"id"`   // increases by one per entry since start
	Time time.Time `json:"time"` // when the batch was read
	// Total is from reading the batch to having every reply. Upstream is
	// the time the batch waited for its replies on its upstream connection
	// (shared or pinned); Proxy is the rest: parsing, policy, and waiting
	// for a fetch shared with other clients (a coalesced read, a miss
	// hold, a local-tier fill).
	TotalMicros    int64  `json:"total_us"`
	ProxyMicros    int64  `json:"proxy_us"`
	UpstreamMicros int64  `json:"upstream_us"`
	Command        string `json:"command"`
	KeyPattern     string `json:"key_pattern,omitempty"`
	Batch          int    `json:"batch"` // commands in the batch
	DB             int    `json:"db"`
	Client         string `json:"client"`
	User           string `json:"user"`
	Listener       string `json:"listener,omitempty"` // the client listener's name
}

// Log is a bounded ring of entries, safe for concurrent use. Adding takes a
// lock, which is fine because only slow batches add.
type Log struct {
	threshold time.Duration
	maxLen    int
	mu        sync.Mutex
	ring      []Entry
	next      int    // where the next entry goes once the ring is full
	total     uint64 // entries ever added; the next ID
}

// New returns a log keeping the last maxLen entries. threshold is only
// reported; the caller decides what is slow.
func New(maxLen int, threshold time.Duration) *Log {
	return &Log{threshold: threshold, maxLen: maxLen, ring: make([]Entry, 0, maxLen)}
}

// Add enters e, giving it the next ID and replacing the oldest entry when
// the log is full.
func (l *Log) Add(e Entry) {
	if l.maxLen == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e.ID = l.total
	if len(l.ring) < l.maxLen {
		l.ring = append(l.ring, e)
	} else {
		l.ring[l.next] = e // the oldest
		l.next = (l.next + 1) % l.maxLen
	}
	l.total++
}

// Entries returns the kept entries, slowest first (newest first among
// equals).
func (l *Log) Entries() []Entry {
	l.mu.Lock()
	out := slices.Clone(l.ring)
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.TotalMicros, a.TotalMicros); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	return out
}

// Total returns how many entries were ever added.
func (l *Log) Total() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Len returns how many entries are kept, as SLOWLOG LEN.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ring)
}

// Reset drops every entry (IDs keep increasing).
func (l *Log) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring, l.next = l.ring[:0], 0
}

// Report is what the HTTP handler serves.
type Report struct {
	ThresholdMicros int64   `json:"threshold_us"`
	MaxLen          int     `json:"max_len"`
	Total           uint64  `json:"total"` // entries ever added, including dropped ones
	Entries         []Entry `json:"entries"`
}

// Handler serves the log as JSON for GET (?limit=N keeps the N slowest) and
// empties it for DELETE, as SLOWLOG RESET does.
func (l *Log) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodDelete:
			l.Reset()
			w.WriteHeader(http.StatusNoContent)
			return
		default:
			w.Header().Set("Allow", "GET, HEAD, DELETE")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		entries := l.Entries()
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				http.Error(w, "limit must be a non-negative integer", http.StatusBadRequest)
				return
			}
			entries = entries[:min(n, len(entries))]
		}
		rep := Report{ThresholdMicros: l.threshold.Microseconds(), MaxLen: l.maxLen, Total: l.Total(), Entries: entries}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	})
}

// maxPattern caps a key pattern's length: a pattern names a family of keys,
// and a key can be up to 512MB.
const maxPattern = 128

// maxSegment is the longest key segment kept as it is; longer ones are
// more likely data than a name.
const maxSegment = 32

// KeyPattern returns the family a key belongs to without its identifying
// parts: the key is split on ':', the last segment is always replaced by
// '*', and so is every other segment that holds anything but letters, '_',
// '-' and '.' (digits, UUIDs, hashes, e-mail addresses) or is longer than
// 32 bytes. "user:1234:profile" gives "user:*:*", "cache:v2:product:789"
// gives "cache:*:product:*", and a key with no ':' gives "*": its only
// segment may be the value-like part.
func KeyPattern(key []byte) string {
	out := make([]byte, 0, min(len(key)+2, maxPattern+2))
	for len(key) > 0 {
		seg, rest, more := cut(key, ':')
		if !more {
			break // the last segment
		}
		if nameLike(seg) {
			out = append(out, seg...)
		} else {
			out = append(out, '*')
		}
		out = append(out, ':')
		key = rest
		if len(out) >= maxPattern {
			break
		}
	}
	return string(append(out, '*'))
}

func cut(b []byte, sep byte) (before, after []byte, found bool) {
	for i, c := range b {
		if c == sep {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

func nameLike(seg []byte) bool {
	if len(seg) == 0 || len(seg) > maxSegment {
		return false
	}
	for _, c := range seg {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}
