package resp

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

func args(r Request) []string {
	var out []string
	for _, a := range r.Args {
		out = append(out, string(a))
	}
	return out
}

// chunkReader returns its data in reads of at most n bytes.
type chunkReader struct {
	data []byte
	n    int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	k := c.n
	if k > len(p) {
		k = len(p)
	}
	if k > len(c.data) {
		k = len(c.data)
	}
	copy(p, c.data[:k])
	c.data = c.data[k:]
	return k, nil
}

// readAll collects every request with its raw bytes copied out, since a
// batch is only valid until the next ReadBatch.
func readAll(t *testing.T, rd *Reader) (got [][]string, raws []string, err error) {
	for {
		reqs, e := rd.ReadBatch()
		for _, r := range reqs {
			got = append(got, args(r))
			raws = append(raws, string(r.Raw))
		}
		if e != nil {
			if e == io.EOF {
				return got, raws, nil
			}
			return got, raws, e
		}
	}
}

func TestReaderPipelineAnySplit(t *testing.T) {
	stream := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nxy\r\n" +
		"PING\r\n" +
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n" +
		"*0\r\n" +
		"\r\n" +
		"set \"a b\" 'c\\'d' \"\\x41\\n\"\n" +
		"*1\r\n$0\r\n\r\n"
	want := [][]string{{"SET", "k", "v\r\nxy"}, {"PING"}, {"GET", "k"}, {"set", "a b", "c'd", "A\n"}, {""}}
	for chunk := 1; chunk <= len(stream); chunk++ {
		rd := NewReader(&chunkReader{data: []byte(stream), n: chunk}, DefaultLimits)
		got, raws, err := readAll(t, rd)
		if err != nil {
			t.Fatalf("chunk %d: %v", chunk, err)
		}
		if len(got) != len(want) {
			t.Fatalf("chunk %d: got %q", chunk, got)
		}
		for i := range want {
			if strings.Join(got[i], "|") != strings.Join(want[i], "|") {
				t.Fatalf("chunk %d req %d: got %q want %q", chunk, i, got[i], want[i])
			}
			// Raw must be the multibulk encoding of the arguments.
			rr := NewReader(strings.NewReader(raws[i]), DefaultLimits)
			back, _, err := readAll(t, rr)
			if err != nil || len(back) != 1 || strings.Join(back[0], "|") != strings.Join(want[i], "|") {
				t.Fatalf("raw %q does not re-parse to %q: %q %v", raws[i], want[i], back, err)
			}
		}
	}
}

func TestReaderErrors(t *testing.T) {
	lim := Limits{MaxArgs: 4, MaxBulk: 10, MaxRequest: 64, MaxInline: 16}
	cases := []struct{ in, want string }{
		{"*5\r\n", "invalid multibulk length"},
		{"*x\r\n", "invalid multibulk length"},
		{"*1\r\n$11\r\n", "invalid bulk length"},
		{"*1\r\n$-1\r\n", "invalid bulk length"},
		{"*1\r\n+PING\r\n", "expected '$', got '+'"},
		{"*4\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n", "request exceeds 64 bytes"},
		{"0123456789012345678", "too big inline request"},
		{"01234567890123456", "too big inline request"}, // 17 > MaxInline without a newline
		{"set \"abc\n", "unbalanced quotes"},
		{"set 'a'b\n", "unbalanced quotes"},
		// Redis looks for an inline line's end with strchr, which stops at
		// a NUL: it never sees the newline and waits until 64 KB have come.
		// Refused at once instead, so the client is not left hanging.
		{"get a\x00b\r\n", "NUL in inline request"},
		{"\x00\n*1\r\n$4\r\nPING\r\n", "NUL in inline request"},
		{"*" + strings.Repeat("1", 40), "invalid multibulk length"},
		{"*1\r\n$" + strings.Repeat("1", 40), "invalid bulk length"},
		// Leading zeros and "-0", which Redis's string2ll refuses (Redis
		// then drops the connection: forwarded on a shared one, they cost
		// every client on it its replies).
		{"*01\r\n$4\r\nPING\r\n", "invalid multibulk length"},
		{"*00\r\n", "invalid multibulk length"},
		{"*-0\r\n", "invalid multibulk length"},
		{"*1\r\n$04\r\nPING\r\n", "invalid bulk length"},
		{"*1\r\n$-0\r\n\r\n", "invalid bulk length"},
		{"*1\r\n$00\r\n\r\n", "invalid bulk length"},
	}
	for _, c := range cases {
		rd := NewReader(strings.NewReader(c.in), lim)
		_, _, err := readAll(t, rd)
		var pe *ProtocolError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrProtocol) {
			t.Errorf("%q: err %v, want protocol error containing %q", c.in, err, c.want)
		}
	}
}

// An inline line of MaxInline bytes before its newline is taken and one
// byte more is refused, as Redis does with PROTO_INLINE_MAX_SIZE (it
// refuses once more than that is buffered with no newline).
func TestReaderInlineAtTheLimit(t *testing.T) {
	lim := Limits{MaxArgs: 4, MaxBulk: 10, MaxRequest: 64, MaxInline: 16}
	got, _, err := readAll(t, NewReader(strings.NewReader("echo 01234567890\n"), lim))
	if err != nil || len(got) != 1 || strings.Join(got[0], " ") != "echo 01234567890" {
		t.Errorf("16 bytes before the newline: %q, %v; want the ECHO", got, err)
	}
	if _, _, err := readAll(t, NewReader(strings.NewReader("echo 012345678901\n"), lim)); !errors.Is(err, ErrProtocol) {
		t.Errorf("17 bytes before the newline: %v, want too big inline request", err)
	}
}

// Redis skips the two bytes after a bulk string without looking at them,
// so a request whose bulk is not followed by CRLF is read as Redis reads
// it, in any split, and its Raw is that request, CRLF in place.
func TestReaderSkipsTwoBytesAfterABulkAsRedis(t *testing.T) {
	stream := "*1\r\n$4\r\nPINGxx*2\r\n$4\r\nECHO\r\n$3\r\nabcd\r\n*1\r\n$4\r\nPING\r\n"
	want := []string{"PING", "ECHO abc", "PING"}
	wantRaw := []string{"*1\r\n$4\r\nPING\r\n", "*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n", "*1\r\n$4\r\nPING\r\n"}
	for split := 1; split < len(stream); split++ {
		rd := NewReader(io.MultiReader(strings.NewReader(stream[:split]), strings.NewReader(stream[split:])), DefaultLimits)
		got, raws, err := readAll(t, rd)
		var joined []string
		for _, g := range got {
			joined = append(joined, strings.Join(g, " "))
		}
		// "d\r" is skipped after "abc"; the "\n" left is an empty inline
		// line, which Redis ignores too.
		if err != nil || strings.Join(joined, "|") != strings.Join(want, "|") || strings.Join(raws, "|") != strings.Join(wantRaw, "|") {
			t.Fatalf("split %d: got %q raws %q err %v, want %q raws %q", split, joined, raws, err, want, wantRaw)
		}
	}
}

// Requests parsed before a protocol error are still delivered, so the
// proxy can answer them before closing the connection.
func TestReaderDeliversRequestsBeforeError(t *testing.T) {
	rd := NewReader(strings.NewReader("PING\r\n*1\r\n+X\r\n"), DefaultLimits)
	reqs, err := rd.ReadBatch()
	if err == nil || len(reqs) != 1 || string(reqs[0].Args[0]) != "PING" {
		t.Fatalf("got %d reqs, err %v", len(reqs), err)
	}
}

// A client declaring a huge argument and then sending it slowly must not make
// the reader allocate for the declaration: the buffer never exceeds
// eagerFactor times what has actually arrived (rounded up to a power of two).
func TestReaderHugeDeclaredLengthDoesNotPreallocate(t *testing.T) {
	lim := DefaultLimits
	hdr := "*2\r\n$3\r\nSET\r\n$500000000\r\n"
	rd := NewReader(iotest.OneByteReader(strings.NewReader(hdr+strings.Repeat("x", 100000))), lim)
	_, err := rd.ReadBatch()
	if err != io.EOF {
		t.Fatalf("want EOF on truncated request, got %v", err)
	}
	if len(rd.buf) > 256<<10 {
		t.Fatalf("buffer grew to %d bytes for 100 kB received", len(rd.buf))
	}
}

// A large argument gets room for all of it at once, from bufpool, and the
// buffer goes back there once the request is served: reading a 200 KB SET
// allocated 480 KB each time (32, 64, 128 and 256 KB) before; now the
// pool's buffer serves request after request. Two clients take turns, each
// request's bytes its own, so a buffer handed from one to the other with
// the first's bytes still in use would show.
func TestReaderLargeArgumentsReusePooledBuffers(t *testing.T) {
	const size, rounds = 200_000, 20
	inputs := make([][]byte, rounds)
	for i := range inputs {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, size)
		inputs[i] = []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$200000\r\n" + string(v) + "\r\n")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i, in := range inputs {
		rd := NewReader(&chunkReader{data: in, n: 4096}, DefaultLimits)
		reqs, err := rd.ReadBatch()
		if err != nil || len(reqs) != 1 || len(reqs[0].Args) != 3 || !bytes.Equal(reqs[0].Args[2], in[len(in)-size-2:len(in)-2]) || !bytes.Equal(reqs[0].Raw, in) {
			t.Fatalf("request %d: %d requests, %v", i, len(reqs), err)
		}
		if _, err := rd.ReadBatch(); err != io.EOF {
			t.Fatalf("request %d: after it %v, want EOF", i, err)
		}
		if cap(rd.buf) > 4*minBuffer {
			t.Fatalf("request %d: the reader kept its %d byte buffer after the request", i, cap(rd.buf))
		}
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / rounds
	t.Logf("%d bytes allocated per %d byte request", per, size)
	if per > 100<<10 && !raceOn {
		t.Errorf("reading a %d byte request allocated %d bytes; want under 100 KB (the pooled buffer reused)", size, per)
	}
}

// After a large request the reader gives its big buffer back.
func TestReaderShrinksAfterLargeRequest(t *testing.T) {
	big := bytes.Repeat([]byte("v"), 4<<20)
	var in bytes.Buffer
	in.WriteString("*2\r\n$4\r\nECHO\r\n$4194304\r\n")
	in.Write(big)
	in.WriteString("\r\nPING\r\n")
	rd := NewReader(&chunkReader{data: in.Bytes(), n: 64 << 10}, DefaultLimits)
	reqs, err := rd.ReadBatch()
	if err != nil || len(reqs) < 1 || len(reqs[0].Args[1]) != len(big) {
		t.Fatalf("big request: %v", err)
	}
	for err == nil {
		_, err = rd.ReadBatch()
	}
	if len(rd.buf) > 4*minBuffer {
		t.Fatalf("buffer still %d bytes after the large request", len(rd.buf))
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n"), uint8(5))
	f.Add([]byte("set \"a\\x41\" 'b'\r\n*1\r\n$4\r\nPING\r\n"), uint8(1))
	f.Add([]byte("*1\r\n$99999999999\r\n"), uint8(7))
	f.Add([]byte("*2\r\n$4\r\nECHO\r\n$3\r\nabcd\r\n*1\r\n$4\r\nPINGxx"), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		lim := Limits{MaxArgs: 64, MaxBulk: 1 << 12, MaxRequest: 1 << 14, MaxInline: 1 << 10}
		one := NewReader(bytes.NewReader(data), lim)
		wantArgs, wantRaw, wantErr := readAll(t, one)
		n := int(chunk)%17 + 1
		split := NewReader(&chunkReader{data: data, n: n}, lim)
		gotArgs, gotRaw, gotErr := readAll(t, split)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("split reads change the error: %v vs %v", wantErr, gotErr)
		}
		if len(wantArgs) != len(gotArgs) {
			t.Fatalf("split reads change request count: %d vs %d", len(wantArgs), len(gotArgs))
		}
		for i := range wantArgs {
			if strings.Join(wantArgs[i], "\x00") != strings.Join(gotArgs[i], "\x00") || wantRaw[i] != gotRaw[i] {
				t.Fatalf("request %d differs across split reads", i)
			}
			// Raw is what the proxy forwards: read alone it must be the
			// same request, whole (bulks not ended by CRLF included).
			again, againRaw, err := readAll(t, NewReader(strings.NewReader(wantRaw[i]), lim))
			if err != nil || len(again) != 1 || strings.Join(again[0], "\x00") != strings.Join(wantArgs[i], "\x00") || againRaw[0] != wantRaw[i] {
				t.Fatalf("request %d: raw %q reads as %q %v", i, wantRaw[i], again, err)
			}
		}
		if len(split.buf) > 2*(1<<14)+minBuffer {
			t.Fatalf("buffer %d exceeds limits", len(split.buf))
		}
	})
}

// Before authentication, Redis's own limits (10 arguments, 16 KB per
// argument) apply, and each batch holds one request, so the limits lift
// for the request after the AUTH that succeeds.
func TestReaderUnauthenticatedLimits(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"*11\r\n", "unauthenticated multibulk length"},
		{"*2\r\n$4\r\nECHO\r\n$16385\r\n", "unauthenticated bulk length"},
	} {
		rd := NewReader(strings.NewReader(c.in), DefaultLimits)
		rd.SetUnauthenticated(true)
		_, _, err := readAll(t, rd)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.in, err, c.want)
		}
	}
	big := "*2\r\n$4\r\nECHO\r\n$16385\r\n" + strings.Repeat("x", 16385) + "\r\n"
	rd := NewReader(strings.NewReader("*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n"+big), DefaultLimits)
	rd.SetUnauthenticated(true)
	reqs, err := rd.ReadBatch()
	if err != nil || len(reqs) != 1 || string(reqs[0].Args[0]) != "AUTH" {
		t.Fatalf("first batch: %d requests, %v; want the AUTH alone", len(reqs), err)
	}
	rd.SetUnauthenticated(false) // the AUTH succeeded
	reqs, err = rd.ReadBatch()
	if err != nil && err != io.EOF || len(reqs) != 1 || len(reqs[0].Args[1]) != 16385 {
		t.Fatalf("after AUTH: %d requests, %v; want the 16385-byte ECHO", len(reqs), err)
	}
}

// "\v" and "\f" are part of an unquoted inline word, as in Redis's
// sdssplitargs (which ends a word only on space, \n, \r and \t), though
// they separate words where Redis skips blanks with isspace. The proxy
// split "ECHO a\vb" in two (found by a bad-input campaign).
func TestInlineVerticalTabAndFormFeed(t *testing.T) {
	for in, want := range map[string]string{
		"ECHO a\vb\r\n":   "ECHO|a\vb",
		"ECHO a\fb\r\n":   "ECHO|a\fb",
		"ECHO \va\r\n":    "ECHO|a",
		"ECHO 'a'\vb\r\n": "ECHO|a|b",
	} {
		got, _, err := readAll(t, NewReader(strings.NewReader(in), DefaultLimits))
		if err != nil || len(got) != 1 || strings.Join(got[0], "|") != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
}

// The default limits take the largest value Redis takes: a SET whose value
// is proto-max-bulk-len bytes long. With the request capped at that size
// too, its header alone pushed it over and the proxy refused a write Redis
// runs (Redis caps a client's query buffer at 1 GB). Only the header is
// sent: the check is made when the bulk's length is read.
func TestDefaultLimitsTakeTheLargestValue(t *testing.T) {
	head := "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$" + strconv.FormatInt(DefaultLimits.MaxBulk, 10) + "\r\n"
	rd := NewReader(strings.NewReader(head), DefaultLimits)
	_, err := rd.ReadBatch()
	if errors.Is(err, ErrProtocol) {
		t.Fatalf("a SET of a %d-byte value was refused: %v", DefaultLimits.MaxBulk, err)
	}
	if err == nil {
		t.Fatal("a request cut short in its value read without an error")
	}
}
