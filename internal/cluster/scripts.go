package cluster

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync"
)

// Bounds of the script cache: past them, new scripts are not remembered
// (their EVALSHA gets NOSCRIPT on a node that lacks them, as without the
// cache).
const (
	maxScripts     = 4096
	maxScriptBytes = 16 << 20
)

// scriptCache remembers the bodies of scripts clients loaded (SCRIPT LOAD,
// EVAL), by SHA1, so that an EVALSHA that meets NOSCRIPT on a node that
// never saw the script (a replica promoted since, a node added) can load
// it there and run again.
type scriptCache struct {
	mu    sync.Mutex
	m     map[string][]byte
	bytes int
}

// note remembers the script of a SCRIPT LOAD or EVAL, and returns the SHA
// an EVALSHA or EVALSHA_RO runs ("" for other commands).
func (c *scriptCache) note(name string, args [][]byte) string {
	switch name {
	case "evalsha", "evalsha_ro":
		if len(args) > 1 {
			return strings.ToLower(string(args[1]))
		}
	case "script|load":
		if len(args) > 2 {
			c.add(args[2])
		}
	case "eval", "eval_ro":
		if len(args) > 1 {
			c.add(args[1])
		}
	}
	return ""
}

func (c *scriptCache) add(body []byte) {
	sum := sha1.Sum(body)
	sha := hex.EncodeToString(sum[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[sha]; ok || len(c.m) >= maxScripts || c.bytes+len(body) > maxScriptBytes {
		return
	}
	if c.m == nil {
		c.m = map[string][]byte{}
	}
	c.m[sha] = append([]byte(nil), body...)
	c.bytes += len(body)
}

func (c *scriptCache) body(sha string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[sha]
}
