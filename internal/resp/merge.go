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
	m, bad := PlanMGET(replies, pos)
	if bad != nil {
		return unexpected(bad)
	}
	return m.AppendTo(make([]byte, 0, m.Len()))
}

// Merged is the reply of a split command whose parts' array elements are
// put together (MGET, KEYS), planned but not yet written: its writer
// appends it where the reply is kept (upstream.Call.AddReplyAppend)
// instead of building it apart and copying it there. Built apart, a
// 1,000,000-key MGET's reply was held three times at once: in the parts'
// replies, merged, and in the client's Call. It refers to the parts'
// replies and to pos, which must stay unchanged until it is written.
type Merged struct {
	parts  [][][]byte // each part's array elements
	pos    [][2]int   // MGET: key k's part and element
	concat bool       // the parts' elements in order (KEYS), not pos's
	n      int        // elements
	size   int        // the merged reply's length
}

// PlanArrays plans the merged reply of a split MGET (key order by pos) or
// KEYS (concat: the parts' elements one after the other), for writing
// where the client's replies are kept; reply, when not nil, is the reply
// instead: the first part's error (FirstError), or unexpected's for a
// part not of the shape.
func PlanArrays(replies [][]byte, pos [][2]int, concat bool, unexpected func([]byte) []byte) (m Merged, reply []byte) {
	if err := FirstError(replies); err != nil {
		return m, err
	}
	var bad []byte
	if concat {
		m, bad = PlanConcat(replies)
	} else {
		m, bad = PlanMGET(replies, pos)
	}
	if bad != nil {
		return m, unexpected(bad)
	}
	return m, nil
}

// PlanMGET plans MergeMGET; bad is the reply of a part that is not an
// array long enough, or nil.
func PlanMGET(replies [][]byte, pos [][2]int) (m Merged, bad []byte) {
	m.parts = make([][][]byte, len(replies))
	for k, r := range replies {
		e, ok := ArrayElements(r)
		if !ok {
			return Merged{}, r
		}
		m.parts[k] = e
	}
	m.pos, m.n = pos, len(pos)
	for _, p := range pos {
		if p[1] >= len(m.parts[p[0]]) {
			return Merged{}, replies[p[0]]
		}
		m.size += len(m.parts[p[0]][p[1]])
	}
	m.size += arrayHeaderLen(m.n)
	return m, nil
}

// PlanConcat plans MergeConcat; bad as for PlanMGET.
func PlanConcat(replies [][]byte) (m Merged, bad []byte) {
	m.parts, m.concat = make([][][]byte, len(replies)), true
	for k, r := range replies {
		e, ok := ArrayElements(r)
		if !ok {
			return Merged{}, r
		}
		m.parts[k] = e
		m.n += len(e)
		for _, x := range e {
			m.size += len(x)
		}
	}
	m.size += arrayHeaderLen(m.n)
	return m, nil
}

// Len is the merged reply's length in bytes.
func (m *Merged) Len() int { return m.size }

// AppendTo appends the merged reply to dst.
func (m *Merged) AppendTo(dst []byte) []byte {
	dst = AppendArray(dst, m.n)
	if !m.concat {
		for _, p := range m.pos {
			dst = append(dst, m.parts[p[0]][p[1]]...)
		}
		return dst
	}
	for _, e := range m.parts {
		for _, x := range e {
			dst = append(dst, x...)
		}
	}
	return dst
}

// arrayHeaderLen is the length of AppendArray's header for n elements.
func arrayHeaderLen(n int) int {
	var b [24]byte
	return len(AppendArray(b[:0], n))
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
	m, bad := PlanConcat(replies)
	if bad != nil {
		return unexpected(bad)
	}
	return m.AppendTo(make([]byte, 0, m.Len()))
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
