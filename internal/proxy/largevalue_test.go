package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// largeRoundTrip sends one command on nc and reads its reply into buf,
// whose first len(want) bytes must then be want: the client allocates
// nothing, so what the process allocates is the proxy's.
func largeRoundTrip(t *testing.T, nc net.Conn, rd *bufio.Reader, cmd []byte, buf, want []byte) {
	t.Helper()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(cmd); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rd, buf[:len(want)]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:len(want)], want) {
		t.Fatalf("reply differs from the value at byte %d", redistest.FirstDifference(buf[:len(want)], want))
	}
}

// A client that writes and reads 100 KB values at -P 1 costs the proxy no
// allocation per request once the buffers are in bufpool: the request's
// read buffer, the Call's reply buffer (the reply is read straight into
// it) and the output (a reply past idleKeep with nothing before it is
// written from where it is, not copied) all go back when the client goes
// idle after each reply, and come back for the next. In RESP2, where the
// GET's reply goes direct from the pipe's reader, and in RESP3, where the
// session writes it (flush). Every reply is checked byte for byte.
//
// Measured before: RESP2 GETs allocated about 260 KB each and SETs 480 KB;
// RESP3 GETs 213 KB (the output, and stampede protection's fetch
// appending the value to the session's local replies, both dropped when
// the client went idle; both now grow from bufpool and go back there).
func TestLargeValuesReuseBuffers(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	const size, rounds = 100_000, 40
	vals := make([][]byte, 4)
	for i := range vals {
		vals[i] = bytes.Repeat([]byte{byte('a' + i)}, size)
		vals[i][0] = '\r' // a CRLF and a '$' inside the value
		vals[i][1] = '\n'
		vals[i][2] = '$'
		if err := rs.Client(t).Set(context.Background(), "large:"+strconv.Itoa(i), vals[i], 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	bulk := func(b []byte) []byte { return fmt.Appendf(nil, "$%d\r\n%s\r\n", len(b), b) }
	buf := make([]byte, 2*size)
	for _, proto := range []string{"2", "3"} {
		nc := p.Dial(t)
		rd := bufio.NewReaderSize(nc, 64<<10)
		largeRoundTrip(t, nc, rd, []byte("*2\r\n$5\r\nHELLO\r\n$1\r\n"+proto+"\r\n"+"*1\r\n$4\r\nPING\r\n"), buf, nil)
		// HELLO's reply, then PONG: read up to PONG's line.
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if line == "+PONG\r\n" {
				break
			}
		}
		gets := make([][]byte, len(vals))
		sets := make([][]byte, len(vals))
		for i, v := range vals {
			k := "large:" + strconv.Itoa(i)
			gets[i] = fmt.Appendf(nil, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(k), k)
			sets[i] = append(fmt.Appendf(nil, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n", len(k), k), bulk(v)...)
		}
		replies := make([][]byte, len(vals))
		for i, v := range vals {
			replies[i] = bulk(v)
		}
		ok := []byte("+OK\r\n")
		for i := range 2 * len(vals) { // warm: connections, pools
			largeRoundTrip(t, nc, rd, sets[i%len(vals)], buf, ok)
			largeRoundTrip(t, nc, rd, gets[i%len(vals)], buf, replies[i%len(vals)])
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range rounds {
			largeRoundTrip(t, nc, rd, gets[i%len(vals)], buf, replies[i%len(vals)])
		}
		runtime.ReadMemStats(&after)
		perGet := (after.TotalAlloc - before.TotalAlloc) / rounds
		runtime.ReadMemStats(&before)
		for i := range rounds {
			largeRoundTrip(t, nc, rd, sets[i%len(vals)], buf, ok)
		}
		runtime.ReadMemStats(&after)
		perSet := (after.TotalAlloc - before.TotalAlloc) / rounds
		t.Logf("RESP%s: %d bytes allocated per GET, %d per SET of %d bytes", proto, perGet, perSet, size)
		// A GC between two uses empties the pools once in a while; a
		// buffer made anew then is 128 KB, so the mean over 40 stays
		// well below the 100 KB a request made each time would cost.
		if (perGet > 32<<10 || perSet > 32<<10) && !raceEnabled() { // sync.Pool drops a quarter of its Puts under -race
			t.Errorf("RESP%s: %d bytes allocated per GET and %d per SET of a %d byte value; want under 32 KB each", proto, perGet, perSet, size)
		}
		nc.Close()
	}
}

// Many clients reading the same large values at once share fetches
// (stampede protection) whose replies grow from bufpool and go back there
// as each client goes idle: no client ever gets bytes of another value.
// go-redis speaks RESP3 (flush path) and RESP2 (direct replies).
func TestLargeValuesConcurrentReadersExact(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	ctx := context.Background()
	const keys = 6
	vals := make([]string, keys)
	for i := range vals {
		b := bytes.Repeat([]byte{byte('A' + i)}, 70_000+i*20_000)
		copy(b, "key "+strconv.Itoa(i)+" starts\r\n$")
		vals[i] = string(b)
		if err := rs.Client(t).Set(ctx, "cv:"+strconv.Itoa(i), vals[i], 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 24)
	for c := range 24 {
		go func() {
			rc := p.Client(t, func(o *redis.Options) { o.Protocol = 2 + c%2 })
			for j := range 60 {
				k := (c + j*j) % keys
				v, err := rc.Get(ctx, "cv:"+strconv.Itoa(k)).Result()
				if err != nil || v != vals[k] {
					done <- fmt.Errorf("client %d (RESP%d), GET cv:%d: %d bytes, %v; want %d bytes", c, 2+c%2, k, len(v), err, len(vals[k]))
					return
				}
			}
			done <- nil
		}()
	}
	for range 24 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
