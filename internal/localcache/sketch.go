package localcache

import (
	"math/bits"
	"sync/atomic"
)

// sketch estimates how often each key was seen recently: a count-min sketch
// of 8-bit saturating counters behind a doorkeeper bit set, TinyLFU style. A
// key seen once only sets its doorkeeper bits, so the one-off keys that
// dominate most traffic never touch the counters.
//
// It is blocked: a key's 4 counters lie in one 64-byte block (one from each
// quarter of it) and its 2 doorkeeper bits in one word, so counting a read
// touches two cache lines however large the sketch is. Misses pass through
// here on every read of a key the tier does not hold, and a sketch sized for
// a busy server does not fit in the core's caches.
//
// halve divides every counter by two, which makes the estimate a decaying
// count over the last few windows. It is due every admission window, and
// also whenever as many sightings as there are blocks × 16 were added since
// the last halving: with more, collisions would lift every key's estimate
// over the admission threshold, so under heavy traffic "hot" means hot
// relative to the rest. All methods are safe for concurrent use without
// locks: counters are packed 8 per uint64 and updated with compare-and-swap.
type sketch struct {
	words  []atomic.Uint64 // blocks of 8 words (64 counters)
	door   []atomic.Uint64
	blocks uint64 // a power of two
	dmask  uint64 // doorkeeper words - 1
	adds   atomic.Int64
	limit  int64
}

const counterMax = 255

// newSketch sizes the sketch for about width distinct keys between
// halvings: width/16 blocks of 64 counters (4 per key) and 4·width
// doorkeeper bits.
func newSketch(width int) *sketch {
	n := uint64(1) << bits.Len(uint(max(width, 64)-1)) // power of two >= width
	s := &sketch{blocks: n / 16, limit: int64(n)}
	s.words = make([]atomic.Uint64, s.blocks*8)
	s.door = make([]atomic.Uint64, n/16)
	s.dmask = uint64(len(s.door)) - 1
	return s
}

// mix spreads h so the block, counter and doorkeeper choices below use
// independent-looking bits.
func mix(h uint64) uint64 {
	h ^= h >> 31
	h *= 0xBF58476D1CE4E5B9
	h ^= h >> 29
	return h
}

// counter returns the word and bit shift of h's i-th counter: block from the
// high bits, then one of the 16 counters (2 words) of quarter i.
func (s *sketch) counter(h uint64, i int) (*atomic.Uint64, uint) {
	block := (h >> 40) & (s.blocks - 1)
	c := uint64(i)*16 + (h>>(4*uint(i)))&15 // 0..63 within the block
	return &s.words[block*8+c/8], uint(8 * (c % 8))
}

// add counts w more sightings of h. It reports whether enough were added
// since the last halving that the sketch should be halved now.
func (s *sketch) add(h uint64, w uint64) (halveDue bool) {
	if w == 0 {
		return false
	}
	halveDue = s.adds.Add(int64(w)) >= s.limit
	h = mix(h)
	if !s.doorSet(h) {
		// First sighting in this window: only remember it.
		w--
		if w == 0 {
			return halveDue
		}
	}
	for i := range 4 {
		word, shift := s.counter(h, i)
		for {
			old := word.Load()
			c := (old >> shift) & 0xff
			if c == counterMax {
				break
			}
			nc := min(c+w, counterMax)
			if word.CompareAndSwap(old, old&^(0xff<<shift)|nc<<shift) {
				break
			}
		}
	}
	return halveDue
}

// estimate returns the number of recent sightings of h (at most 256).
func (s *sketch) estimate(h uint64) uint64 {
	h = mix(h)
	m := uint64(counterMax)
	for i := range 4 {
		word, shift := s.counter(h, i)
		m = min(m, (word.Load()>>shift)&0xff)
	}
	if s.doorHas(h) {
		m++
	}
	return m
}

// doorBits returns h's doorkeeper word and its two bits.
func (s *sketch) doorBits(h uint64) (*atomic.Uint64, uint64) {
	return &s.door[(h>>20)&s.dmask], 1<<((h>>8)&63) | 1<<((h>>14)&63)
}

// doorSet sets h's doorkeeper bits and reports whether they were all set.
func (s *sketch) doorSet(h uint64) bool {
	word, b := s.doorBits(h)
	if word.Load()&b == b {
		return true
	}
	word.Or(b)
	return false
}

// seen reports whether h was added since the last halving (or, rarely,
// another key with the same doorkeeper bits was).
func (s *sketch) seen(h uint64) bool { return s.doorHas(mix(h)) }

func (s *sketch) doorHas(h uint64) bool {
	word, b := s.doorBits(h)
	return word.Load()&b == b
}

// halve ages the sketch: every counter is divided by two and the doorkeeper
// forgets everything, so a key must be seen again to count as hot.
func (s *sketch) halve() {
	s.adds.Store(0)
	const keep = 0x7f7f7f7f7f7f7f7f // the low 7 bits of every byte after >> 1
	for j := range s.words {
		w := &s.words[j]
		for {
			old := w.Load()
			if old == 0 || w.CompareAndSwap(old, (old>>1)&keep) {
				break
			}
		}
	}
	for j := range s.door {
		s.door[j].Store(0)
	}
}
