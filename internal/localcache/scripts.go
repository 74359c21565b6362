package localcache

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"sync"
	"sync/atomic"

	"github.com/redproxy/redproxy/internal/commands"
)

// Scripts that may run SWAPDB.
//
// Redis (7.0) sends no invalidation for SWAPDB, so the fence that follows a
// script (WriteStart) would not drop what the tier read from either
// database before a SWAPDB the script ran: every read of a key cached
// before it would be served the other database's old value after the
// script's reply, until max_ttl. A script that may run SWAPDB is therefore
// handled as a forwarded SWAPDB command, except that the databases it
// swaps are not known (they may be computed, or follow a SELECT in the
// script): every database is flushed before it is sent and again once its
// reply is in (Writes.swapped).
//
// Which scripts may: those whose text contains "swapdb" in any ASCII case.
// EVAL carries its text. For EVALSHA and FCALL the proxy remembers what it
// saw pass through it (NoteScript): the SHA1s of the scripts sent with
// SCRIPT LOAD, EVAL or EVAL_RO whose text mentions swapdb, and whether any
// library sent with FUNCTION LOAD mentions it, in which case every FCALL
// is treated so (FCALL names a function, and which library defines it, or
// which of the library's functions reach its SWAPDB, the proxy cannot
// tell). Both are kept for the proxy's life: a script flushed or a library
// replaced later (or a LOAD Redis refused) only costs flushes, never a stale
// read. Not covered: a script or library Redis holds that the proxy never
// saw loaded (loaded directly, through another proxy, before this proxy
// started, or with FUNCTION RESTORE), and a script that builds the command
// name at run time; as for a SWAPDB run outside the proxy, nothing tells
// the tier about those swaps.
//
// Scripts that do not mention swapdb, the hot ones (rate limiters sending
// EVALSHA on every request), cost a scan of EVAL's text, or an atomic load
// (and, once a script mentioning swapdb was seen, a map lookup) for
// EVALSHA, and an atomic load for FCALL.
type scriptWatch struct {
	// nshas is len(shas) (or maxSwapScripts+1 once full), read without mu
	// so EVALSHA costs one atomic load while no such script was seen.
	nshas atomic.Int32
	// libs: a library mentioning swapdb was loaded through the proxy.
	libs atomic.Bool

	mu   sync.Mutex
	shas map[[sha1.Size]byte]struct{}
}

// maxSwapScripts bounds the scripts mentioning swapdb remembered by SHA1.
// Past it every EVALSHA is treated as one that may run SWAPDB: forgetting
// one would serve stale reads, and a workload loading that many different
// scripts that swap databases is not one to cache for.
const maxSwapScripts = 1024

// NoteScript is called for every command sent to Redis that may load a
// script or a function library (SCRIPT LOAD, EVAL, EVAL_RO, FUNCTION LOAD;
// any other command is ignored), before EVALSHA or FCALL can run it. It
// remembers the ones that mention swapdb (see scriptWatch).
func (c *Cache) NoteScript(cmd *commands.Command, args [][]byte) {
	if cmd == nil {
		return
	}
	body := -1
	switch cmd.Name {
	case "eval", "eval_ro":
		body = 1
	case "script|load":
		body = 2
	case "function|load":
		// FUNCTION LOAD [REPLACE] code
		if len(args) > 2 && MentionsSwapDB(args[len(args)-1]) {
			c.scripts.libs.Store(true)
		}
		return
	}
	if body < 0 || len(args) <= body || !MentionsSwapDB(args[body]) {
		return
	}
	sum := sha1.Sum(args[body])
	w := &c.scripts
	w.mu.Lock()
	defer w.mu.Unlock()
	if int(w.nshas.Load()) > maxSwapScripts {
		return // full: every EVALSHA is treated as swapping already
	}
	if w.shas == nil {
		w.shas = map[[sha1.Size]byte]struct{}{}
	}
	if _, ok := w.shas[sum]; ok {
		return
	}
	if len(w.shas) == maxSwapScripts {
		w.shas = nil
		w.nshas.Store(maxSwapScripts + 1)
		return
	}
	w.shas[sum] = struct{}{}
	w.nshas.Store(int32(len(w.shas)))
}

// scriptSwaps reports whether the script write cmd may run SWAPDB.
func (c *Cache) scriptSwaps(cmd *commands.Command, args [][]byte) bool {
	w := &c.scripts
	switch cmd.Name {
	case "eval":
		return len(args) > 1 && MentionsSwapDB(args[1])
	case "evalsha":
		n := w.nshas.Load()
		if n == 0 || len(args) < 2 {
			return false
		}
		if n > maxSwapScripts {
			return true
		}
		var sum [sha1.Size]byte
		sha := args[1]
		if len(sha) != 2*sha1.Size {
			return false // Redis answers NOSCRIPT
		}
		if _, err := hex.Decode(sum[:], sha); err != nil {
			return false
		}
		w.mu.Lock()
		_, ok := w.shas[sum]
		w.mu.Unlock()
		return ok
	case "fcall":
		return w.libs.Load()
	}
	return false
}

// MentionsSwapDB reports whether b contains "swapdb" in any ASCII case.
// It looks for the rarest of the six letters in scripts, 'w', with
// bytes.IndexByte (vectorised) in each case, and checks the letters
// around each one found: an EVAL's text is scanned on every EVAL while the
// tier is on (twice: NoteScript and WriteStart), and a 375-byte rate
// limiter takes 76-90 ns where a byte-by-byte comparison took 226-282
// (BenchmarkMentionsSwapDB and ...ByteByByte, 5 runs each).
func MentionsSwapDB(b []byte) bool {
	return mentionsSwapDBAt(b, 'w') || mentionsSwapDBAt(b, 'W')
}

// mentionsSwapDBAt finds "swapdb" in any case by its second letter, w.
func mentionsSwapDBAt(b []byte, w byte) bool {
	for i := 1; i+5 <= len(b); {
		j := bytes.IndexByte(b[i:len(b)-4], w)
		if j < 0 {
			return false
		}
		i += j
		if b[i-1]|0x20 == 's' && b[i+1]|0x20 == 'a' && b[i+2]|0x20 == 'p' &&
			b[i+3]|0x20 == 'd' && b[i+4]|0x20 == 'b' {
			return true
		}
		i++
	}
	return false
}
