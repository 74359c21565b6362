package mirror

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redproxy/redproxy/internal/resp"
)

// EVALSHA runs a script only a server that has it cached can run, and the
// mirror's cache is not the primary's: a script loaded before mirroring
// started, or lost to a restart or SCRIPT FLUSH of the mirror, answers
// NOSCRIPT there. So the sender remembers the bodies it mirrors (SCRIPT
// LOAD, EVAL) and sends an EVALSHA whose body it knows as the EVAL of that
// body, which runs the same script on any server and caches it there. An
// EVALSHA of a body it never saw goes as it is; if the mirror answers
// NOSCRIPT, it is counted as dropped (DropNoScript), not as a mirror error.

// Bounds of the remembered scripts; past them new bodies are not kept
// (their EVALSHA goes as it is).
const (
	maxScripts     = 4096
	maxScriptBytes = 16 << 20
)

var noScriptReply = []byte("-NOSCRIPT")

// scripts are the bodies the sender saw, by lowercase hex SHA1. Only the
// sender goroutine uses them.
type scripts struct {
	m     map[string][]byte
	bytes int
}

func (c *scripts) add(body []byte) {
	sum := sha1.Sum(body)
	sha := hex.EncodeToString(sum[:])
	if _, ok := c.m[sha]; ok || len(c.m) >= maxScripts || c.bytes+len(body) > maxScriptBytes {
		return
	}
	if c.m == nil {
		c.m = map[string][]byte{}
	}
	c.m[sha] = bytes.Clone(body)
	c.bytes += len(body)
}

// prepare returns the part to send for part: an EVALSHA rewritten as the
// EVAL of its body when known, else part itself; SCRIPT LOAD and EVAL
// bodies are remembered on the way.
func (s *sender) prepare(part []byte) []byte {
	if !scriptish(part) {
		return part
	}
	args, err := resp.SplitCommand(part, s.args[:0])
	s.args = args
	if err != nil || len(args) < 2 {
		return part
	}
	c := &s.scripts
	name := args[0]
	switch {
	case equalFold(name, "eval") || equalFold(name, "eval_ro"):
		c.add(args[1])
	case equalFold(name, "script") && len(args) == 3 && equalFold(args[1], "load"):
		c.add(args[2])
	case equalFold(name, "evalsha") || equalFold(name, "evalsha_ro"):
		body := c.m[string(bytes.ToLower(args[1]))]
		if body == nil {
			return part
		}
		eval := "EVAL"
		if len(name) == len("evalsha_ro") {
			eval = "EVAL_RO"
		}
		args[1] = body
		// A new buffer each time: the Call keeps the part until the round
		// is done.
		out := resp.AppendCommandNamed(nil, eval, args[1:]...)
		clear(s.args)
		return out
	}
	clear(s.args)
	return part
}

// scriptish reports, from the first bytes of the command's name, whether
// it may be EVAL, EVALSHA or SCRIPT (LOAD), so that other commands cost no
// parsing.
func scriptish(part []byte) bool {
	// *N\r\n$L\r\nNAME
	i := bytes.IndexByte(part, '\n')
	if i < 0 || i+1 >= len(part) || part[i+1] != '$' {
		return false
	}
	j := bytes.IndexByte(part[i+1:], '\n')
	if j < 0 || i+j+2 >= len(part) {
		return false
	}
	switch part[i+j+2] | 0x20 {
	case 'e', 's':
		return true
	}
	return false
}

func equalFold(b []byte, s string) bool { return bytes.EqualFold(b, []byte(s)) }
