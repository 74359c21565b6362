package resp

import "strconv"

// Merging the replies of one command split into parts: by slot in cluster
// mode (internal/cluster), by upstream with routes (internal/route). The
// parts' replies come in part order; unexpected makes the reply for a part
// whose reply has not the shape its command promises.

// FirstError is the first error reply among replies, or nil: a split
// command fails as a whole when a part failed, though the others ran.
func FirstError(replies [][]byte) []byte {
	for _, r := range replies {
		if IsError(r) {
			return r
		}
	}
	return nil
}

// MergeMGET puts the parts' array elements back in key order: pos[k] is
// key k's part and element.
func MergeMGET(replies [][]byte, pos [][2]int, unexpected func([]byte) []byte) []byte {
	elems := make([][][]byte, len(replies))
	size := 24 // the array's header, at most
	for k, r := range replies {
		e, ok := ArrayElements(r)
		if !ok {
			return unexpected(r)
		}
		elems[k] = e
		size += len(r)
	}
	// Sized once: grown by appends (by a quarter each time past 256
	// elements' worth), a large MGET's reply was allocated about five
	// times over (BenchmarkMergeMGET: 70 MB for an 11 MB reply).
	out := AppendArray(make([]byte, 0, size), len(pos))
	for _, p := range pos {
		if p[1] >= len(elems[p[0]]) {
			return unexpected(replies[p[0]])
		}
		out = append(out, elems[p[0]][p[1]]...)
	}
	return out
}

// MergeSum adds the parts' integers (DEL, EXISTS, DBSIZE ...).
func MergeSum(replies [][]byte, unexpected func([]byte) []byte) []byte {
	var sum int64
	for _, r := range replies {
		n, ok := Integer(r)
		if !ok {
			return unexpected(r)
		}
		sum += n
	}
	return append(strconv.AppendInt([]byte{':'}, sum, 10), '\r', '\n')
}

// MergeConcat puts the parts' array elements one after the other (KEYS).
func MergeConcat(replies [][]byte, unexpected func([]byte) []byte) []byte {
	var all [][]byte
	size := 24
	for _, r := range replies {
		e, ok := ArrayElements(r)
		if !ok {
			return unexpected(r)
		}
		all = append(all, e...)
		size += len(r)
	}
	out := AppendArray(make([]byte, 0, size), len(all)) // sized once, as MergeMGET's
	for _, e := range all {
		out = append(out, e...)
	}
	return out
}

// MergeFirstNonNull is the first reply, looking from part start on, that
// is neither an error nor null (RANDOMKEY); else the first error; else
// the reply of part start.
func MergeFirstNonNull(replies [][]byte, start int) []byte {
	var firstErr []byte
	for k := range replies {
		r := replies[(start+k)%len(replies)]
		switch {
		case IsError(r):
			if firstErr == nil {
				firstErr = r
			}
		case !IsNull(r):
			return r
		}
	}
	if firstErr != nil {
		return firstErr
	}
	return replies[start]
}

// MergeAllOnes merges arrays of 0/1 integers element by element: 1 only
// where every part said 1 (SCRIPT EXISTS).
func MergeAllOnes(replies [][]byte, unexpected func([]byte) []byte) []byte {
	var out [][]byte
	for k, r := range replies {
		e, ok := ArrayElements(r)
		if !ok || k > 0 && len(e) != len(out) {
			return unexpected(r)
		}
		if k == 0 {
			out = e
			continue
		}
		for j := range e {
			if n, _ := Integer(e[j]); n == 0 {
				out[j] = e[j]
			}
		}
	}
	buf := AppendArray(nil, len(out))
	for _, e := range out {
		buf = append(buf, e...)
	}
	return buf
}

// AppendArray appends the header of an array of n elements.
func AppendArray(dst []byte, n int) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\r', '\n')
}

// MergeMin is the least of the parts' integers, or of arrays of integers
// element by element (WAIT and WAITAOF over several upstreams: a write
// is on N replicas only if every part of it is).
func MergeMin(replies [][]byte, unexpected func([]byte) []byte) []byte {
	if len(replies) == 0 {
		return unexpected(nil)
	}
	if least, ok := Integer(replies[0]); ok {
		for _, r := range replies[1:] {
			n, ok := Integer(r)
			if !ok {
				return unexpected(r)
			}
			least = min(least, n)
		}
		return append(strconv.AppendInt([]byte{':'}, least, 10), '\r', '\n')
	}
	var least []int64
	for k, r := range replies {
		e, ok := ArrayElements(r)
		if !ok || k > 0 && len(e) != len(least) {
			return unexpected(r)
		}
		for j, el := range e {
			n, ok := Integer(el)
			switch {
			case !ok:
				return unexpected(r)
			case k == 0:
				least = append(least, n)
			default:
				least[j] = min(least[j], n)
			}
		}
	}
	out := AppendArray(nil, len(least))
	for _, n := range least {
		out = append(strconv.AppendInt(append(out, ':'), n, 10), '\r', '\n')
	}
	return out
}
