package localcache

import (
	"github.com/tidwall/redcon"

	"github.com/redproxy/redproxy/internal/upstream"
)

// Touching keys back.
//
// A hit served from the tier never reaches Redis, so to Redis's eviction
// the hottest keys looked the most idle: under allkeys-lru (what a cache
// is usually run with) Redis evicted them first, and under allkeys-lfu
// their counters decayed (found by review: with the tier on, the key an
// application read most was evicted while keys read a third as often
// stayed). So a key served from the tier is queued, at most once per
// touch_interval, and its fill connection's heartbeat sends the queue as
// TOUCH, which updates a key's LRU clock and LFU counter and changes
// nothing else. The fill connection tracks in OPTIN mode, so a TOUCH adds
// nothing to Redis's tracking table. The cost to Redis is at most one key
// lookup per cached key per touch_interval, batched into a few commands
// per heartbeat.

// maxQueuedTouches bounds the keys one fill connection queues between two
// heartbeats; the rest wait for their next hit.
const maxQueuedTouches = 4096

// touchBatch is how many keys one TOUCH carries outside cluster mode.
const touchBatch = 256

// queueTouch queues key for the next heartbeat. It is called on the hit
// path with the key's shard locked; touchMu is only ever taken after a
// shard lock, or alone.
func (fc *fillConn) queueTouch(key string) {
	fc.touchMu.Lock()
	if len(fc.touches) < maxQueuedTouches {
		fc.touches = append(fc.touches, key)
	} else {
		fc.up.m.touchesDropped.Inc()
	}
	fc.touchMu.Unlock()
}

// sendTouches sends the queued keys as TOUCH commands on the fill
// connection and waits for the replies, swapping the queue with spare,
// which it returns emptied for the next call. In cluster mode a node's
// keys may be in several slots, so each key gets its own TOUCH.
func (fc *fillConn) sendTouches(call *upstream.Call, spare []string) []string {
	fc.touchMu.Lock()
	keys := fc.touches
	fc.touches = spare[:0]
	fc.touchMu.Unlock()
	if len(keys) == 0 {
		return keys
	}
	per := touchBatch
	if fc.up.cluster != nil {
		per = 1
	}
	call.Reset()
	var buf []byte
	for rest := keys; len(rest) > 0; {
		n := min(per, len(rest))
		start := len(buf)
		buf = redcon.AppendArray(buf, n+1)
		buf = redcon.AppendBulkString(buf, "TOUCH")
		for _, k := range rest[:n] {
			buf = redcon.AppendBulkString(buf, k)
		}
		call.Add(buf[start:len(buf):len(buf)])
		rest = rest[n:]
	}
	if err := fc.pipe.Send(call); err == nil {
		call.Wait()
		fc.up.m.touches.Add(float64(len(keys)))
	}
	clear(keys) // keep no key strings alive past their use
	return keys[:0]
}
