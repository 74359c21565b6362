// Package audit walks a live Redis keyspace and reports what the policy
// could not stop at the door: keys without a TTL (overall, and where a TTL
// rule requires one), TTLs above a rule's max, keys breaking the naming
// rules, and big keys.
//
// It is built not to hurt the Redis it inspects: it iterates with SCAN
// (never KEYS) in batches of a bounded COUNT, sends each batch's PTTL and
// MEMORY USAGE calls as one pipeline of O(1) commands, and pauses between
// batches so other clients' commands interleave. MEMORY USAGE uses Redis's
// default sampling (5 elements of an aggregate), which is cheap but an
// estimate; SAMPLES 0 (Options.MemorySamples = AllSamples) is exact but costs
// O(elements) per key, which on a big hash or set blocks Redis for as long as
// that takes.
//
// SCAN guarantees to return every key that exists for the whole walk, but may
// return a key twice while Redis resizes its table, and keys created or
// expiring meanwhile may or may not be seen. The audit removes duplicates
// (remembering up to Options.MaxTracked keys) so that counts on a quiet
// keyspace are exact.
package audit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/policy"
)

// Options tune the walk; zero values mean the defaults below.
type Options struct {
	// Count is the SCAN COUNT hint per batch (default 500). Larger batches
	// finish sooner but hold Redis longer per round trip.
	Count int
	// Pause is the sleep between batches (default 2ms; negative = none).
	Pause time.Duration
	// Match limits the walk to keys matching a glob (default "*").
	Match string
	// Examples is how many example keys each finding keeps (default 10).
	Examples int
	// BigKeyBytes is the MEMORY USAGE threshold of a big key. Default: the
	// policy's max_value_bytes when that rule is on, else 100KB.
	BigKeyBytes int64
	// SkipMemory skips MEMORY USAGE (no big-key finding).
	SkipMemory bool
	// MemorySamples: 0 = Redis's default sampling, n > 0 = SAMPLES n,
	// AllSamples = SAMPLES 0 (exact, but O(elements) per key).
	MemorySamples int
	// MaxTracked bounds the keys remembered to drop SCAN's duplicates
	// (default 10 million; a map entry of a 64-bit hash, about 70 bytes of
	// the process each as measured at 1M keys, 87 MB). Past it, counts may include
	// duplicates and Report.Exact is false.
	MaxTracked int
	// ProgressEvery is the minimum interval between progress lines (default
	// 500ms).
	ProgressEvery time.Duration
}

// AllSamples as Options.MemorySamples asks MEMORY USAGE for SAMPLES 0.
const AllSamples = -1

// Defaults.
const (
	DefaultCount         = 500
	DefaultPause         = 2 * time.Millisecond
	DefaultExamples      = 10
	DefaultBigKeyBytes   = 100 << 10
	DefaultMaxTracked    = 10_000_000
	DefaultProgressEvery = 500 * time.Millisecond
)

func (o Options) withDefaults(p *policy.Policy) Options {
	if o.Count <= 0 {
		o.Count = DefaultCount
	}
	if o.Pause == 0 {
		o.Pause = DefaultPause
	}
	if o.Match == "" {
		o.Match = "*"
	}
	if o.Examples <= 0 {
		o.Examples = DefaultExamples
	}
	if o.BigKeyBytes <= 0 {
		o.BigKeyBytes = p.MaxValueBytes()
		if o.BigKeyBytes <= 0 {
			o.BigKeyBytes = DefaultBigKeyBytes
		}
	}
	if o.MaxTracked <= 0 {
		o.MaxTracked = DefaultMaxTracked
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = DefaultProgressEvery
	}
	return o
}

// ErrMemoryUsage wraps a failure of MEMORY USAGE (for example an ACL that
// forbids it); retry with Options.SkipMemory.
var ErrMemoryUsage = errors.New("audit: MEMORY USAGE failed (use --skip-memory to audit without big-key detection)")

// Run walks the keyspace of rdb's database and reports findings against p
// (nil p: no TTL or naming rules, only keys without TTL and big keys).
// Progress lines go to progress at most every Options.ProgressEvery; pass
// io.Discard to silence them. When ctx ends or Redis fails mid-walk, Run
// returns the report so far (Complete false) together with the error.
func Run(ctx context.Context, rdb *redis.Client, p *policy.Policy, opts Options, progress io.Writer) (*Report, error) {
	o := opts.withDefaults(p)
	a := &auditor{
		rdb:      rdb,
		p:        p,
		o:        o,
		progress: progress,
		seen:     map[uint64]struct{}{},
		seed:     maphash.MakeSeed(),
		start:    time.Now(),
		report:   newReport(o),
	}
	err := a.walk(ctx)
	a.report.Duration = time.Since(a.start)
	a.report.DurationSeconds = a.report.Duration.Seconds()
	a.report.Complete = err == nil
	a.report.sort()
	if progress != nil {
		state := "done:"
		if err != nil {
			state = "stopped:"
		}
		fmt.Fprintf(progress, "audit: %s %d keys in %.1fs (%.0f keys/s)\n", state, a.report.Keys, a.report.DurationSeconds, a.rate())
	}
	return a.report, err
}

type auditor struct {
	rdb      *redis.Client
	p        *policy.Policy
	o        Options
	progress io.Writer
	seen     map[uint64]struct{}
	seed     maphash.Seed
	start    time.Time
	lastLine time.Time
	report   *Report
}

func (a *auditor) walk(ctx context.Context) error {
	var cursor uint64
	for {
		keys, next, err := a.rdb.Scan(ctx, cursor, a.o.Match, int64(a.o.Count)).Result()
		if err != nil {
			return fmt.Errorf("audit: SCAN: %w", err)
		}
		if err := a.batch(ctx, keys); err != nil {
			return err
		}
		a.maybeProgress()
		if cursor = next; cursor == 0 {
			return nil
		}
		if a.o.Pause > 0 {
			t := time.NewTimer(a.o.Pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// batch inspects one SCAN batch with a single pipeline.
func (a *auditor) batch(ctx context.Context, keys []string) error {
	keys = a.dedupe(keys)
	if len(keys) == 0 {
		return nil
	}
	pipe := a.rdb.Pipeline()
	ttls := make([]*redis.Cmd, len(keys))
	mems := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		ttls[i] = pipe.Do(ctx, "pttl", k)
		if !a.o.SkipMemory {
			switch {
			case a.o.MemorySamples == AllSamples:
				mems[i] = pipe.MemoryUsage(ctx, k, 0)
			case a.o.MemorySamples > 0:
				mems[i] = pipe.MemoryUsage(ctx, k, a.o.MemorySamples)
			default:
				mems[i] = pipe.MemoryUsage(ctx, k)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		// Exec reports the first failed command; find out which kind.
		for i := range keys {
			if err := ttls[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("audit: PTTL: %w", err)
			}
			if mems[i] != nil {
				if err := mems[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
					return fmt.Errorf("%w: %v", ErrMemoryUsage, err)
				}
			}
		}
		return fmt.Errorf("audit: %w", err)
	}
	for i, k := range keys {
		pttl, err := ttls[i].Int64()
		if err != nil || pttl == -2 {
			continue // expired or deleted since SCAN returned it
		}
		mem := int64(-1)
		if mems[i] != nil {
			if m, err := mems[i].Result(); err == nil {
				mem = m
			}
		}
		a.key(k, pttl, mem)
	}
	return nil
}

// dedupe drops keys already seen, remembering them by a 64-bit hash: a
// collision would merge two keys, which at 10 million keys happens with
// probability below 1e-5.
func (a *auditor) dedupe(keys []string) []string {
	out := keys[:0]
	for _, k := range keys {
		h := maphash.String(a.seed, k)
		if _, dup := a.seen[h]; dup {
			continue
		}
		if len(a.seen) < a.o.MaxTracked {
			a.seen[h] = struct{}{}
		} else {
			a.report.Exact = false // a later duplicate of k would count twice
		}
		out = append(out, k)
	}
	return out
}

// key records one key's findings. pttl is -1 for no TTL; mem is -1 when
// unknown.
func (a *auditor) key(k string, pttl, mem int64) {
	r := a.report
	r.Keys++
	kb := []byte(k)
	if pttl == -1 {
		r.NoTTL.add(k, a.o.Examples)
	}
	if rule, ok := a.p.TTLRule(kb); ok && rule.Action != policy.Off {
		switch {
		case pttl == -1 && rule.Required:
			r.finding(&r.TTL, policy.RuleTTL, rule.Pattern).add(k, a.o.Examples)
		case pttl > 0 && rule.Max > 0 && time.Duration(pttl)*time.Millisecond > rule.Max:
			r.finding(&r.TTL, policy.RuleTTLMax, rule.Pattern).add(k, a.o.Examples)
		}
	}
	if v := a.p.CheckKeyName(kb); v != nil {
		r.finding(&r.Names, v.Rule, v.Pattern).add(k, a.o.Examples)
	}
	if mem > a.o.BigKeyBytes {
		r.BigKeys.add(k, mem, a.o.Examples)
	}
}

func (a *auditor) rate() float64 {
	if s := time.Since(a.start).Seconds(); s > 0 {
		return float64(a.report.Keys) / s
	}
	return 0
}

func (a *auditor) maybeProgress() {
	if a.progress == nil || time.Since(a.lastLine) < a.o.ProgressEvery {
		return
	}
	a.lastLine = time.Now()
	r := a.report
	var names int64
	for _, f := range r.Names {
		names += f.Count
	}
	fmt.Fprintf(a.progress, "audit: scanned %d keys (%.0f keys/s): %d without TTL, %d badly named, %d big\n",
		r.Keys, a.rate(), r.NoTTL.Count, names, r.BigKeys.Count)
}
