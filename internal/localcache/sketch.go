package localcache

import (
	"math/bits"
	"sync/atomic"
)

// sketch estimates how often each key was seen recently: a count-min sketch
// of 8-bit saturating counters (4 rows) behind a doorkeeper bit set, TinyLFU
// style. A key seen once only sets its doorkeeper bits, so the one-off keys
// that dominate most traffic never touch the counters. halve divides every
// counter by two, which makes the estimate a decaying count over the last
// few windows. All methods are safe for concurrent use without locks:
// counters are packed 8 per uint64 and updated with compare-and-swap.
type sketch struct {
	rows  [sketchDepth][]atomic.Uint64
	door  []atomic.Uint64
	mask  uint64 // counters per row - 1
	dmask uint64 // doorkeeper bits - 1
}

const (
	sketchDepth = 4
	counterMax  = 255
)

// newSketch sizes the sketch for about width distinct keys per window.
func newSketch(width int) *sketch {
	n := uint64(1) << bits.Len(uint(max(width, 64)-1)) // power of two >= width
	s := &sketch{mask: n - 1, dmask: 4*n - 1}
	for i := range s.rows {
		s.rows[i] = make([]atomic.Uint64, n/8)
	}
	s.door = make([]atomic.Uint64, 4*n/64)
	return s
}

// index returns the counter index of h in row i: each row uses a different
// part of the hash, remixed so rows are independent.
func (s *sketch) index(h uint64, i int) uint64 {
	x := h + uint64(i)*0x9E3779B97F4A7C15
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return x & s.mask
}

func (s *sketch) get(row int, idx uint64) uint64 {
	return (s.rows[row][idx/8].Load() >> (8 * (idx % 8))) & 0xff
}

// add counts w more sightings of h.
func (s *sketch) add(h uint64, w uint64) {
	if w == 0 {
		return
	}
	if !s.doorSet(h) {
		// First sighting in this window: only remember it.
		w--
		if w == 0 {
			return
		}
	}
	for i := range s.rows {
		idx := s.index(h, i)
		word := &s.rows[i][idx/8]
		shift := 8 * (idx % 8)
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
}

// estimate returns the number of recent sightings of h (at most 256).
func (s *sketch) estimate(h uint64) uint64 {
	m := uint64(counterMax)
	for i := range s.rows {
		m = min(m, s.get(i, s.index(h, i)))
	}
	if s.doorHas(h) {
		m++
	}
	return m
}

// doorSet sets h's doorkeeper bits and reports whether they were all set.
func (s *sketch) doorSet(h uint64) bool {
	all := true
	for _, b := range s.doorBits(h) {
		word := &s.door[b/64]
		bit := uint64(1) << (b % 64)
		if word.Load()&bit != 0 {
			continue
		}
		all = false
		word.Or(bit)
	}
	return all
}

func (s *sketch) doorHas(h uint64) bool {
	for _, b := range s.doorBits(h) {
		if s.door[b/64].Load()&(1<<(b%64)) == 0 {
			return false
		}
	}
	return true
}

func (s *sketch) doorBits(h uint64) [2]uint64 {
	return [2]uint64{h & s.dmask, (h >> 32) * 0x9E3779B97F4A7C15 >> 20 & s.dmask}
}

// halve ages the sketch: every counter is divided by two and the doorkeeper
// forgets everything, so a key must be seen again to count as hot.
func (s *sketch) halve() {
	const keep = 0x7f7f7f7f7f7f7f7f // the low 7 bits of every byte after >> 1
	for i := range s.rows {
		for j := range s.rows[i] {
			w := &s.rows[i][j]
			for {
				old := w.Load()
				if old == 0 || w.CompareAndSwap(old, (old>>1)&keep) {
					break
				}
			}
		}
	}
	for j := range s.door {
		s.door[j].Store(0)
	}
}
