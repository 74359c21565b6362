package route

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// ringKeys are keys to place: plain, with hash tags (empty, nested,
// unclosed), and with bytes over 0x7f, which nutcracker's hashes read as
// signed chars.
func ringKeys() []string {
	var keys []string
	for i := range 400 {
		switch i % 8 {
		case 0, 1:
			// Varied throughout: fnv1a_64 as twemproxy folds it spreads
			// keys differing in a short suffix over a narrow range.
			keys = append(keys, "user:"+strconv.FormatUint(uint64(uint32(i)*2654435761), 16)+":"+strconv.Itoa(i))
		case 2:
			keys = append(keys, "user:"+strconv.Itoa(i))
		case 3:
			keys = append(keys, "{user"+strconv.Itoa(i/16)+"}:cart:"+strconv.Itoa(i))
		case 4:
			keys = append(keys, "a{}b{c"+strconv.Itoa(i)+"}")
		case 5:
			keys = append(keys, "x{"+strconv.Itoa(i)+"-unclosed")
		case 6:
			keys = append(keys, "caf\xe9:\xff\x80:"+strconv.Itoa(i))
		default:
			keys = append(keys, strconv.Itoa(i*7919))
		}
	}
	return keys
}

// setThrough writes every key through the RESP server at addr, pipelined
// on one raw connection (nutcracker refuses go-redis's HELLO).
func setThrough(t *testing.T, addr string, keys []string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	w := bufio.NewWriter(c)
	for _, k := range keys {
		fmt.Fprintf(w, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n", len(k), k)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for _, k := range keys {
		line, err := r.ReadString('\n')
		if err != nil || line != "+OK\r\n" {
			t.Fatalf("SET %q through %s: %q, %v", k, addr, line, err)
		}
	}
}

// nutcrackerPlacement empties servers, starts nutcracker with pool (whose
// Servers name them, in order), writes keys through it and returns, for
// each key, the index of the one server holding it: where twemproxy put
// it, for a ring to be compared with.
func nutcrackerPlacement(t *testing.T, servers []*redistest.Server, pool redistest.NutcrackerPool, keys []string) map[string]int {
	t.Helper()
	ctx := context.Background()
	for _, s := range servers {
		if err := s.Client(t).FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	setThrough(t, redistest.StartNutcracker(t, pool), keys)
	where := make(map[string]int, len(keys))
	for i, s := range servers {
		held, err := s.Client(t).Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range held {
			if j, dup := where[k]; dup {
				t.Fatalf("key %q on servers %d and %d after one SET through nutcracker", k, j, i)
			}
			where[k] = i
		}
	}
	for _, k := range keys {
		if _, ok := where[k]; !ok {
			t.Fatalf("key %q on no server after a SET through nutcracker", k)
		}
	}
	return where
}

// TestRingMatchesNutcracker writes keys through a real nutcracker for each
// hash and distribution redproxy implements and checks that the ring
// picks, for every key, the server nutcracker put it on: a twemproxy pool
// replaced by redproxy must find every key where it is.
func TestRingMatchesNutcracker(t *testing.T) {
	servers := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	keys := ringKeys()
	for _, tc := range []struct {
		name        string
		hash, dist  string
		tag         string
		weights     []int
		serverNames []string // twemproxy's optional server names
	}{
		{name: "fnv1a_64/ketama", hash: "fnv1a_64", dist: "ketama"},
		{name: "fnv1a_64/ketama/tag", hash: "fnv1a_64", dist: "ketama", tag: "{}"},
		{name: "fnv1a_64/ketama/weights", hash: "fnv1a_64", dist: "ketama", weights: []int{1, 2, 5}},
		{name: "fnv1a_64/ketama/names", hash: "fnv1a_64", dist: "ketama", serverNames: []string{"alpha", "beta", "gamma"}},
		{name: "md5/ketama", hash: "md5", dist: "ketama"},
		{name: "fnv1_64/ketama", hash: "fnv1_64", dist: "ketama"},
		{name: "fnv1a_32/ketama", hash: "fnv1a_32", dist: "ketama"},
		{name: "fnv1_32/ketama", hash: "fnv1_32", dist: "ketama"},
		{name: "crc32a/ketama", hash: "crc32a", dist: "ketama"},
		{name: "crc32/ketama", hash: "crc32", dist: "ketama"},
		{name: "fnv1a_64/modula", hash: "fnv1a_64", dist: "modula"},
		{name: "fnv1a_64/modula/names", hash: "fnv1a_64", dist: "modula", serverNames: []string{"zed", "b", "alpha"}},
		{name: "md5/modula/weights/tag", hash: "md5", dist: "modula", tag: "{}", weights: []int{3, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lines, names []string
			ups := make([]int, len(servers))
			for i, s := range servers {
				w := 1
				if tc.weights != nil {
					w = tc.weights[i]
				}
				line := s.Addr() + ":" + strconv.Itoa(w)
				name := s.Addr() // twemproxy hashes "host:port" when no name is given
				if tc.serverNames != nil {
					line += " " + tc.serverNames[i]
					name = tc.serverNames[i]
				}
				lines, names, ups[i] = append(lines, line), append(names, name), i
			}
			where := nutcrackerPlacement(t, servers, redistest.NutcrackerPool{Servers: lines, Hash: tc.hash, Distribution: tc.dist, HashTag: tc.tag}, keys)
			ring, err := NewRing(ups, RingConfig{Distribution: tc.dist, Hash: tc.hash, HashTag: tc.tag, Names: names, Weights: tc.weights})
			if err != nil {
				t.Fatal(err)
			}
			perServer := make([]int, len(servers))
			wrong := 0
			for _, k := range keys {
				on := where[k]
				perServer[on]++
				if got := ring.Pick([]byte(k)); got != on {
					if wrong++; wrong <= 5 {
						t.Errorf("key %q: nutcracker put it on server %d, the ring picks %d", k, on, got)
					}
				}
			}
			if wrong > 0 {
				t.Errorf("%d of %d keys placed differently from nutcracker", wrong, len(keys))
			}
			for i, n := range perServer {
				// crc32 is 15 bits and every ketama point is above it:
				// nutcracker puts every key on one server, and so must
				// the ring (checked above).
				if n == 0 && !(tc.hash == "crc32" && tc.dist == "ketama") {
					t.Errorf("server %d got none of %d keys (per server: %v): the check proves little", i, len(keys), perServer)
				}
			}
		})
	}
}
