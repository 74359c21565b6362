package commands

import (
	"math"
	"strconv"
	"time"
)

// BlockTimeout returns how long the blocking command args says Redis may
// keep it waiting: BLPOP's and the other B*POP/B*MOVE commands' seconds
// (first argument for BLMPOP and BZMPOP, last for the others), WAIT's and
// WAITAOF's milliseconds, XREAD's and XREADGROUP's BLOCK milliseconds.
// ok is false for a timeout it cannot read (Redis refuses the command, or
// a module's command) and for none; d is 0 for "for ever".
func (c *Command) BlockTimeout(args [][]byte) (d time.Duration, ok bool) {
	if c == nil || len(args) < 2 {
		return 0, false
	}
	switch c.Name {
	case "blpop", "brpop", "bzpopmin", "bzpopmax", "brpoplpush", "blmove":
		return seconds(args[len(args)-1])
	case "blmpop", "bzmpop":
		return seconds(args[1])
	case "wait":
		if len(args) == 3 {
			return millis(args[2])
		}
	case "waitaof":
		if len(args) == 4 {
			return millis(args[3])
		}
	case "xread", "xreadgroup":
		for i := 1; i+1 < len(args); i++ {
			a := args[i]
			switch {
			case optionFold("block", a):
				return millis(args[i+1])
			case optionFold("streams", a):
				return 0, false
			case optionFold("group", a):
				i += 2
			case optionFold("count", a):
				i++
			}
		}
	}
	return 0, false
}

// seconds reads a timeout in seconds, as Redis does (a decimal number,
// not negative).
func seconds(b []byte) (time.Duration, bool) {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > float64(math.MaxInt64/int64(time.Second)) {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}

// millis reads a timeout in milliseconds (an integer, not negative).
func millis(b []byte) (time.Duration, bool) {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/int64(time.Millisecond) {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}
