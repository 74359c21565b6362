package resp

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"
)

// Extend hands back every request exactly once and in order, whatever
// where reads split the stream: a consumer that extends each batch as far
// as it goes (the look-ahead's use) and one that never does read the same
// requests. Pipelines of multibulk and inline requests, small and up to
// 40 KB, arrive in random pieces with pauses, so batches end mid-request,
// at a full buffer and at the batch limit.
func TestReaderExtendKeepsEveryRequestOnce(t *testing.T) {
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var stream []byte
		var want []string
		for i := range 400 + rng.IntN(400) {
			val := strings.Repeat(string(rune('a'+i%26)), rng.IntN(64))
			if rng.IntN(40) == 0 {
				val = strings.Repeat("L", 1000+rng.IntN(40000))
			}
			if rng.IntN(8) == 0 && !strings.ContainsAny(val, " ") && len(val) < 1000 {
				stream = fmt.Appendf(stream, "SET k%d %s\r\n", i, val)
				if val == "" {
					want = append(want, fmt.Sprintf("SET|k%d", i))
				} else {
					want = append(want, fmt.Sprintf("SET|k%d|%s", i, val))
				}
				continue
			}
			stream = fmt.Appendf(stream, "*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$%d\r\n%s\r\n", len(fmt.Sprint("k", i)), i, len(val), val)
			want = append(want, fmt.Sprintf("SET|k%d|%s", i, val))
		}
		for _, extend := range []bool{false, true} {
			got := readAllExtending(t, stream, len(want), seed, extend)
			if len(got) != len(want) {
				t.Fatalf("seed %d extend=%v: %d requests, want %d", seed, extend, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("seed %d extend=%v: request %d = %.80q, want %.80q", seed, extend, i, got[i], want[i])
				}
			}
		}
	}
}

// readAllExtending sends stream over a loopback connection in random
// pieces and reads its n requests (or until a read waits 2 s) with a
// Reader whose batches are capped at 50, each batch extended as far as
// Extend goes when extend is set.
func readAllExtending(t *testing.T, stream []byte, n int, seed uint64, extend bool) []string {
	server, client := tcpPair(t)
	go func() {
		rng := rand.New(rand.NewPCG(seed, 8)) // the writer's own
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(30000))
			if _, err := client.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
			if rng.IntN(3) == 0 {
				time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
			}
		}
	}()
	lim := DefaultLimits
	lim.MaxBatch = 50
	r := NewReader(server, lim)
	defer r.Close()
	var got []string
	extended := 0
	for len(got) < n {
		server.SetReadDeadline(time.Now().Add(2 * time.Second))
		reqs, err := r.ReadBatch()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				break // fewer than n came: the caller says so
			}
			t.Fatalf("ReadBatch: %v", err)
		}
		for extend {
			server.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
			more, grew := r.Extend(64<<10, 0)
			if more == nil {
				break
			}
			reqs = more
			if !grew {
				break
			}
			extended++
		}
		for _, q := range reqs {
			var parts []string
			for _, a := range q.Args {
				parts = append(parts, string(a))
			}
			got = append(got, strings.Join(parts, "|"))
		}
	}
	if extend && extended == 0 {
		t.Errorf("no batch was ever extended: the test did not exercise Extend")
	}
	return got
}
