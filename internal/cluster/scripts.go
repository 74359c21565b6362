package cluster

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Bounds of the script cache: past them, the script used least recently
// is forgotten (its EVALSHA gets NOSCRIPT on a node that lacks it, as
// without the cache). It kept the first scripts it saw and no more, so an
// application that builds EVAL bodies on the fly filled it for the life of
// the process, and every script after was never healed (found by review).
const (
	maxScripts     = 4096
	maxScriptBytes = 16 << 20
)

// scriptCache remembers the bodies of scripts clients loaded (SCRIPT LOAD,
// EVAL), by SHA1, so that an EVALSHA that meets NOSCRIPT on a node that
// never saw the script (a replica promoted since, a node added) can load
// it there and run again. An EVALSHA counts as a use, so the scripts an
// application runs by SHA stay while one-off EVALs come and go.
type scriptCache struct {
	mu    sync.Mutex
	lru   *simplelru.LRU[string, []byte]
	bytes int
}

// note remembers the script of a SCRIPT LOAD or EVAL, and returns the SHA
// an EVALSHA or EVALSHA_RO runs ("" for other commands).
func (c *scriptCache) note(name string, args [][]byte) string {
	switch name {
	case "evalsha", "evalsha_ro":
		if len(args) > 1 {
			sha := strings.ToLower(string(args[1]))
			c.mu.Lock()
			if c.lru != nil {
				c.lru.Get(sha) // a use: most recent
			}
			c.mu.Unlock()
			return sha
		}
	case "script|load":
		if len(args) > 2 {
			c.add(args[2])
		}
	case "eval", "eval_ro":
		if len(args) > 1 {
			c.add(args[1])
		}
	case "script|flush":
		// A client that flushed the scripts expects NOSCRIPT for them,
		// as Redis Cluster answers; the cache loaded them again on the
		// next EVALSHA, which ran while SCRIPT EXISTS said 0 (found by a
		// probe). A flush sent to the nodes directly is not seen.
		c.mu.Lock()
		if c.lru != nil {
			c.lru.Purge()
		}
		c.mu.Unlock()
	}
	return ""
}

func (c *scriptCache) add(body []byte) {
	if len(body) > maxScriptBytes {
		return
	}
	sum := sha1.Sum(body)
	sha := hex.EncodeToString(sum[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru == nil {
		c.lru, _ = simplelru.NewLRU(maxScripts, func(_ string, b []byte) { c.bytes -= len(b) })
	}
	if _, ok := c.lru.Get(sha); ok {
		return
	}
	c.lru.Add(sha, append([]byte(nil), body...))
	c.bytes += len(body)
	for c.bytes > maxScriptBytes {
		c.lru.RemoveOldest()
	}
}

func (c *scriptCache) body(sha string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru == nil {
		return nil
	}
	b, _ := c.lru.Get(sha)
	return b
}
