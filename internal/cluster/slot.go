// Package cluster routes commands to the nodes of a Redis Cluster so that
// clients see one ordinary Redis: it keeps the slot map (topology.go),
// one upstream.Backend per node, and executes a client's batch across the
// nodes, following MOVED and ASK itself and merging split multi-key
// commands back in the client's order (router.go).
package cluster

import (
	"strconv"
	"sync"
)

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// crcTable is CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(b []byte) uint16 {
	var c uint16
	for _, x := range b {
		c = c<<8 ^ crcTable[byte(c>>8)^x]
	}
	return c
}

// Slot returns the hash slot of key as Redis Cluster computes it: when the
// key has a '{' followed later by a '}' with at least one byte between the
// first such pair, only those bytes are hashed (a hash tag), so that keys
// sharing a tag share a slot.
func Slot(key []byte) int {
	for i, c := range key {
		if c != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return int(crc16(key) & (Slots - 1))
			}
		}
		break
	}
	return int(crc16(key) & (Slots - 1))
}

// tagsBySlot[s] is a short hash tag whose slot is s, built on first use.
var (
	tagsOnce   sync.Once
	tagsBySlot [Slots]string
)

// KeyInSlot is a key made of prefix and a hash tag, whose slot is s: for
// a key of the proxy's own that must live on the node owning s.
func KeyInSlot(prefix string, s int) string {
	tagsOnce.Do(func() {
		left := Slots
		for i := 0; left > 0; i++ {
			tag := strconv.FormatInt(int64(i), 36)
			if k := crc16([]byte(tag)) & (Slots - 1); tagsBySlot[k] == "" {
				tagsBySlot[k] = tag
				left--
			}
		}
	})
	return prefix + "{" + tagsBySlot[s] + "}"
}
