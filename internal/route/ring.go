package route

import (
	"crypto/md5"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"
)

// A Ring spreads the keys of one [[route]] over several upstreams by a
// hash of the key, the way twemproxy (nutcracker) distributes keys over
// its servers, so that a twemproxy pool can be replaced by redproxy with
// every key still found where twemproxy put it: the same hash functions,
// the same ketama continuum (points named "<server name>-<i>", md5 of
// each giving four points) and modula table, the same hash tag rule.
// The algorithms are twemproxy's published behaviour (nc_ketama.c,
// nc_modula.c, nc_hashkit.h); TestRingMatchesNutcracker checks them
// against a running nutcracker. Servers are never ejected: twemproxy's
// auto_eject_hosts moves keys when a server fails, which a Redis used as
// a store must not see.
type Ring struct {
	hash   func([]byte) uint32
	tag    [2]byte // hash tag delimiters; tag[0] == 0: none
	points []ringPoint
	ketama bool // else modula: points[hash % len(points)]
}

type ringPoint struct {
	value uint32
	up    int // index into the Table's upstreams
}

// RingConfig says how a [[route]] spreads its keys (config.Route).
type RingConfig struct {
	Distribution string   // "ketama" (default) or "modula"
	Hash         string   // HashNames; default "fnv1a_64", twemproxy's
	HashTag      string   // "" or two characters, "{}" as Redis Cluster's
	Names        []string // the name each upstream is hashed under (twemproxy's server name, by default its "host:port")
	Weights      []int    // per upstream, default 1 each
}

// Ring errors, for configuration checks.
var (
	ErrRingHash         = errors.New("route: unknown hash")
	ErrRingDistribution = errors.New("route: unknown distribution")
)

// ringHashes are twemproxy's key hashes that redproxy implements. They
// read the key's bytes as C's signed char does on x86 and ARM Linux
// builds of nutcracker (a byte over 0x7f sign-extends), which matters for
// keys that are not ASCII.
var ringHashes = map[string]func([]byte) uint32{
	"fnv1a_64": fnv1a64,
	"fnv1_64":  fnv1x64,
	"fnv1a_32": fnv1a32,
	"fnv1_32":  fnv1x32,
	"md5":      func(k []byte) uint32 { return md5Word(md5.Sum(k), 0) },
	"crc32a":   crc32.ChecksumIEEE,
	"crc32": func(k []byte) uint32 {
		return (crc32.ChecksumIEEE(k) >> 16) & 0x7fff
	},
}

// HashNames are the hash functions a ring may use.
func HashNames() []string {
	var names []string
	for n := range ringHashes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Distributions are the distributions a ring may use.
var Distributions = []string{"ketama", "modula"}

const (
	// ketamaPointsPerServer is twemproxy's continuum size per server at
	// equal weights; each md5 of a point name gives four points.
	ketamaPointsPerServer = 160
	ketamaPointsPerHash   = 4
)

// NewRing builds the ring of upstreams ups (indexes into the Table's
// upstreams) as c says.
func NewRing(ups []int, c RingConfig) (*Ring, error) {
	if len(ups) == 0 {
		return nil, errors.New("route: a ring needs upstreams")
	}
	if len(c.Names) != len(ups) {
		return nil, fmt.Errorf("route: %d names for %d upstreams", len(c.Names), len(ups))
	}
	if c.Weights != nil && len(c.Weights) != len(ups) {
		return nil, fmt.Errorf("route: %d weights for %d upstreams", len(c.Weights), len(ups))
	}
	r := &Ring{}
	hashName := c.Hash
	if hashName == "" {
		hashName = "fnv1a_64"
	}
	if r.hash = ringHashes[hashName]; r.hash == nil {
		return nil, fmt.Errorf("%w %q", ErrRingHash, c.Hash)
	}
	if c.HashTag != "" {
		if len(c.HashTag) != 2 {
			return nil, fmt.Errorf("route: hash_tag %q: want two characters, as \"{}\"", c.HashTag)
		}
		// A NUL would also read as "no tag" in r.tag, and twemproxy copies
		// the tag as a C string and delimits with whatever byte follows
		// its copy: no placement could match one, so none is offered.
		if strings.IndexByte(c.HashTag, 0) >= 0 {
			return nil, fmt.Errorf("route: hash_tag %q: a NUL byte cannot delimit a hash tag", c.HashTag)
		}
		r.tag = [2]byte{c.HashTag[0], c.HashTag[1]}
	}
	weight := func(i int) int {
		if c.Weights == nil {
			return 1
		}
		return c.Weights[i]
	}
	total := 0
	for i := range ups {
		if weight(i) <= 0 {
			return nil, fmt.Errorf("route: weight %d of %q: must be at least 1", weight(i), c.Names[i])
		}
		total += weight(i)
	}
	switch c.Distribution {
	case "", "ketama":
		r.ketama = true
		for i, up := range ups {
			// As nutcracker computes it, in float32: the share of 160
			// points per server this one's weight earns, in whole
			// md5s of four points.
			share := float32(weight(i)) / float32(total)
			n := uint32(floor32(share*ketamaPointsPerServer/ketamaPointsPerHash*float32(len(ups))+0.0000000001)) * ketamaPointsPerHash
			for p := range n / ketamaPointsPerHash {
				sum := md5.Sum([]byte(c.Names[i] + "-" + strconv.FormatUint(uint64(p), 10)))
				for w := range ketamaPointsPerHash {
					r.points = append(r.points, ringPoint{value: md5Word(sum, w), up: up})
				}
			}
		}
		// Stable: equal values keep server order, as a tie in
		// nutcracker's qsort may not; a tie of two 32-bit points is rare.
		slices.SortStableFunc(r.points, func(a, b ringPoint) int {
			switch {
			case a.value < b.value:
				return -1
			case a.value > b.value:
				return 1
			}
			return 0
		})
	case "modula":
		// nutcracker sorts its servers by name (shorter names first,
		// then bytewise) when it checks them for duplicates, and a
		// modula table follows that order, not the configuration's.
		order := make([]int, len(ups))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int {
			if d := len(c.Names[a]) - len(c.Names[b]); d != 0 {
				return d
			}
			return strings.Compare(c.Names[a], c.Names[b])
		})
		for _, i := range order {
			for range weight(i) {
				r.points = append(r.points, ringPoint{up: ups[i]})
			}
		}
	default:
		return nil, fmt.Errorf("%w %q", ErrRingDistribution, c.Distribution)
	}
	if len(r.points) == 0 {
		return nil, errors.New("route: the ring has no points")
	}
	return r, nil
}

// floor32 is floorf: float32 values here are small and positive.
func floor32(f float32) float32 { return float32(uint64(f)) }

// Pick is the upstream of key.
func (r *Ring) Pick(key []byte) int {
	var h uint32 // nutcracker hashes an empty key as 0, without the hash function (found by review)
	if k := r.tagged(key); len(k) > 0 {
		h = r.hash(k)
	}
	if !r.ketama {
		return r.points[h%uint32(len(r.points))].up
	}
	// The first point at or after h, wrapping to the first.
	i, _ := slices.BinarySearchFunc(r.points, h, func(p ringPoint, h uint32) int {
		if p.value < h {
			return -1
		}
		return 1
	})
	if i == len(r.points) {
		i = 0
	}
	return r.points[i].up
}

// tagged is the part of key hashed: with a hash tag, what lies between
// the first opening delimiter and the next closing one when that is not
// empty, else the whole key (as twemproxy, and Redis Cluster for "{}").
func (r *Ring) tagged(key []byte) []byte {
	if r.tag[0] == 0 {
		return key
	}
	for i, c := range key {
		if c != r.tag[0] {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == r.tag[1] {
				if j > i+1 {
					return key[i+1 : j]
				}
				return key
			}
		}
		return key
	}
	return key
}

// Upstreams are the ring's upstreams that hold at least one point, each
// once, in the order of the points.
func (r *Ring) Upstreams() []int {
	var out []int
	for _, p := range r.points {
		if !slices.Contains(out, p.up) {
			out = append(out, p.up)
		}
	}
	return out
}

// md5Word is word w of an md5 digest, little-endian, as nutcracker reads
// its points and its md5 key hash.
func md5Word(sum [16]byte, w int) uint32 {
	b := sum[4*w:]
	return uint32(b[3])<<24 | uint32(b[2])<<16 | uint32(b[1])<<8 | uint32(b[0])
}

// signed is a key byte as C's (signed) char converts to an unsigned
// integer: sign-extended.
func signed(c byte) uint64 { return uint64(int64(int8(c))) }

// The FNV variants as nutcracker has them: the 64-bit ones fold their
// offset basis and prime to 32 bits for fnv1a_64 and keep 64 bits for
// fnv1_64, and both return the low 32 bits.
func fnv1a64(k []byte) uint32 {
	h := uint32(0xcbf29ce484222325 & 0xffffffff)
	for _, c := range k {
		h ^= uint32(signed(c))
		h *= uint32(0x100000001b3 & 0xffffffff)
	}
	return h
}

func fnv1x64(k []byte) uint32 {
	h := uint64(0xcbf29ce484222325)
	for _, c := range k {
		h *= 0x100000001b3
		h ^= signed(c)
	}
	return uint32(h)
}

func fnv1a32(k []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range k {
		h ^= uint32(signed(c))
		h *= 16777619
	}
	return h
}

func fnv1x32(k []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range k {
		h *= 16777619
		h ^= uint32(signed(c))
	}
	return h
}
