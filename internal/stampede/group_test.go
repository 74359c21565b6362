package stampede

import (
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/redproxy/redproxy/internal/redistest"
)

// state reports a key's fetches, for tests to wait for a caller to be
// parked where they expect it.
func (g *Group) state(key string) (inflight, next bool, inflightWaiters, nextWaiters int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.lookup(maphash.Bytes(g.seed, []byte(key)), []byte(key))
	if e == nil {
		return
	}
	if e.inflight != nil {
		inflight, inflightWaiters = true, e.inflight.waiters
	}
	if e.next != nil {
		next, nextWaiters = true, e.next.waiters
	}
	return
}

// size is the number of keys with an entry.
func (g *Group) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, e := range g.keys {
		for ; e != nil; e = e.chain {
			n++
		}
	}
	return n
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// gates numbers the fetches a test's fetch function runs and holds each one
// until the test opens it, after the fetch has "executed" (body ran): its
// reply is on the way but not yet delivered.
type gates struct {
	mu      sync.Mutex
	n       int
	started chan int
	open    map[int]chan struct{}
}

func newGates() *gates {
	return &gates{started: make(chan int, 100), open: map[int]chan struct{}{}}
}

func (g *gates) ch(n int) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.open[n]
	if c == nil {
		c = make(chan struct{})
		g.open[n] = c
	}
	return c
}

func (g *gates) fetch(body func(n int) ([]byte, error)) func() ([]byte, error) {
	return func() ([]byte, error) {
		g.mu.Lock()
		g.n++
		n := g.n
		g.mu.Unlock()
		reply, err := body(n)
		g.started <- n
		<-g.ch(n)
		return reply, err
	}
}

func (g *gates) release(n int) { close(g.ch(n)) }

func (g *gates) waitStarted(t *testing.T, want int) {
	t.Helper()
	select {
	case n := <-g.started:
		if n != want {
			t.Fatalf("fetch %d started, want %d", n, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("fetch %d never started", want)
	}
}

type result struct {
	reply  string
	shared bool
	err    error
}

func doAsync(g *Group, key string, fetch func() ([]byte, error)) chan result {
	ch := make(chan result, 1)
	go func() {
		r, shared, err := g.Do(key, fetch)
		ch <- result{string(r), shared, err}
	}()
	return ch
}

func numbered(n int) ([]byte, error) { return []byte(strconv.Itoa(n)), nil }

// A read that arrives while a fetch is in flight does not join it: it leads
// the next fetch, which later readers join; that fetch is sent only when the
// first has returned.
func TestJoinRule(t *testing.T) {
	m := NewMetrics(nil)
	g := NewGroup(Options{Metrics: m})
	gt := newGates()
	f := gt.fetch(numbered)

	a := doAsync(g, "k", f)
	gt.waitStarted(t, 1)
	b := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
	c := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 1 }, "C never joined the next fetch")
	if _, _, w, _ := g.state("k"); w != 0 {
		t.Fatalf("%d callers joined the fetch in flight", w)
	}

	gt.release(1)
	if r := <-a; r.reply != "1" || r.shared || r.err != nil {
		t.Fatalf("A = %+v, want its own fetch 1", r)
	}
	gt.waitStarted(t, 2)
	gt.release(2)
	if r := <-b; r.reply != "2" || r.shared || r.err != nil {
		t.Fatalf("B = %+v, want its own fetch 2", r)
	}
	if r := <-c; r.reply != "2" || !r.shared || r.err != nil {
		t.Fatalf("C = %+v, want B's fetch 2, shared", r)
	}
	if g.size() != 0 {
		t.Fatal("the group keeps state after its fetches returned")
	}
	if counter(m.Coalesced) != 3 || counter(m.FetchesSaved) != 1 {
		t.Fatalf("metrics: coalesced %v saved %v, want 3 and 1", counter(m.Coalesced), counter(m.FetchesSaved))
	}
}

// A Lead (a fetch its leader sends itself, ended from elsewhere) keeps the
// join rule: reads that arrive while it is in flight collect behind it and
// share one fetch, sent only once the Lead has ended; no one gets the
// Lead's reply, or its error; a key with a fetch of any kind cannot be led.
func TestLeadCollectsReadsBehindIt(t *testing.T) {
	m := NewMetrics(nil)
	g := NewGroup(Options{Metrics: m})
	l, ok := g.begin([]byte("k"), m)
	if !ok || !l.Active() {
		t.Fatal("begin refused a key with no fetch")
	}
	if _, ok := g.begin([]byte("k"), m); ok {
		t.Fatal("begin led a key whose fetch is in flight")
	}
	var fetches atomic.Int32
	f := func() ([]byte, error) { fetches.Add(1); return []byte("after"), nil }
	b := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
	c := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 1 }, "C never joined the next fetch")
	if _, ok := g.begin([]byte("k"), m); ok {
		t.Fatal("begin led a key with a fetch collecting")
	}
	if n := fetches.Load(); n != 0 {
		t.Fatalf("%d fetches sent while the Lead was in flight", n)
	}
	l.End([]byte("before"), errors.New("the lead's own error"))
	for name, ch := range map[string]chan result{"B": b, "C": c} {
		if r := <-ch; r.reply != "after" || r.err != nil {
			t.Fatalf("%s = %+v, want the fetch sent after the Lead ended", name, r)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Fatalf("%d fetches behind the Lead, want 1", n)
	}
	if g.size() != 0 {
		t.Fatal("the group keeps state after its fetches returned")
	}
	if counter(m.Coalesced) != 3 || counter(m.FetchesSaved) != 1 {
		t.Fatalf("metrics: coalesced %v saved %v, want 3 and 1", counter(m.Coalesced), counter(m.FetchesSaved))
	}
	// A lone Lead's entry is reused, as a lone Do's is.
	for range 3 {
		l, ok := g.begin([]byte("k"), m)
		if !ok {
			t.Fatal("begin refused a key whose fetches all returned")
		}
		l.End([]byte("v"), nil)
	}
	if g.size() != 0 || len(g.free) != 1 {
		t.Fatalf("after lone Leads: %d keys, %d free entries, want 0 and 1", g.size(), len(g.free))
	}
}

// The unsafe test mode (joins to fetches in flight) never leads: its
// checks run on Do's path.
func TestNoLeadInUnsafeMode(t *testing.T) {
	g := NewGroup(Options{unsafeJoinInFlight: true})
	if _, ok := g.begin([]byte("k"), nil); ok {
		t.Fatal("begin led in the unsafe mode")
	}
}

// Under heavy concurrency every reply comes from a fetch that started after
// its caller called Do, and at most one fetch per key runs at a time.
func TestEveryReplyStartedAfterItsCall(t *testing.T) {
	g := NewGroup(Options{})
	var started, running, maxRunning atomic.Int64
	fetch := func() ([]byte, error) {
		n := started.Add(1)
		r := running.Add(1)
		for {
			m := maxRunning.Load()
			if r <= m || maxRunning.CompareAndSwap(m, r) {
				break
			}
		}
		for range 50 {
			// Take a little time so that many callers arrive while the
			// fetch is running, without sleeping.
			_ = strconv.Itoa(int(n))
		}
		running.Add(-1)
		return []byte(strconv.FormatInt(n, 10)), nil
	}
	var stale atomic.Int64
	var wg sync.WaitGroup
	const workers, calls = 32, 300
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				before := started.Load()
				r, _, err := g.Do("k", fetch)
				if err != nil {
					t.Error(err)
					return
				}
				if n, _ := strconv.ParseInt(string(r), 10, 64); n <= before {
					stale.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if maxRunning.Load() != 1 {
		t.Fatalf("%d fetches of one key ran at once, want 1", maxRunning.Load())
	}
	if started.Load() >= workers*calls {
		t.Fatalf("%d fetches for %d calls: nothing was coalesced", started.Load(), workers*calls)
	}
	if stale.Load() != 0 {
		t.Fatalf("%d replies came from fetches started before the call", stale.Load())
	}
	t.Logf("%d calls, %d fetches", workers*calls, started.Load())
}

func TestWaiterCap(t *testing.T) {
	m := NewMetrics(nil)
	g := NewGroup(Options{MaxWaiters: 2, Metrics: m})
	gt := newGates()
	f := gt.fetch(numbered)
	a := doAsync(g, "k", f)
	gt.waitStarted(t, 1)
	b := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
	c := doAsync(g, "k", f)
	d := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 2 }, "C and D never joined")
	if _, _, err := g.Do("k", f); !errors.Is(err, ErrTooManyWaiters) {
		t.Fatalf("third waiter: err = %v, want ErrTooManyWaiters", err)
	}
	if counter(m.Overflows) != 1 {
		t.Fatalf("overflows = %v, want 1", counter(m.Overflows))
	}
	// Another key is not affected by k's waiters.
	if r, _, err := g.Do("other", numbered0); err != nil || string(r) != "0" {
		t.Fatalf("other key: %q, %v", r, err)
	}
	gt.release(1)
	gt.waitStarted(t, 2)
	gt.release(2)
	for i, ch := range []chan result{a, b, c, d} {
		if r := <-ch; r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
	}
}

func numbered0() ([]byte, error) { return []byte("0"), nil }

// An error goes to the callers of the fetch that produced it and is not
// kept: the next call fetches again.
func TestErrorsNotKept(t *testing.T) {
	g := NewGroup(Options{})
	boom := errors.New("boom")
	gt := newGates()
	f := gt.fetch(func(n int) ([]byte, error) {
		if n == 2 {
			return []byte("-ERR wrong\r\n"), boom
		}
		return numbered(n)
	})
	a := doAsync(g, "k", f)
	gt.waitStarted(t, 1)
	b := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
	c := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 1 }, "C never joined")
	gt.release(1)
	if r := <-a; r.err != nil || r.reply != "1" {
		t.Fatalf("A got %+v, want fetch 1", r)
	}
	gt.waitStarted(t, 2)
	gt.release(2)
	for _, ch := range []chan result{b, c} {
		if r := <-ch; !errors.Is(r.err, boom) {
			t.Fatalf("got %+v, want fetch 2's error", r)
		}
	}
	gt.release(3)
	if r, shared, err := g.Do("k", f); err != nil || string(r) != "3" || shared {
		t.Fatalf("after the error: %q shared=%v err=%v, want a fresh fetch 3", r, shared, err)
	}
}

// A fetch that panics wakes its waiters with ErrFetchPanicked, panics in
// its leader, and leaves the key usable.
func TestLeaderPanics(t *testing.T) {
	g := NewGroup(Options{})
	gt := newGates()
	f := gt.fetch(func(n int) ([]byte, error) {
		if n == 2 {
			panic("fetch bug")
		}
		return numbered(n)
	})
	a := doAsync(g, "k", f)
	gt.waitStarted(t, 1)
	leaderPanic := make(chan any, 1)
	go func() {
		defer func() { leaderPanic <- recover() }()
		g.Do("k", f)
	}()
	redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
	c := doAsync(g, "k", f)
	redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 1 }, "C never joined")
	gt.release(1)
	<-a
	// Fetch 2 panics before reaching its gate.
	if p := <-leaderPanic; p != "fetch bug" {
		t.Fatalf("leader recovered %v, want the fetch's panic", p)
	}
	if r := <-c; !errors.Is(r.err, ErrFetchPanicked) {
		t.Fatalf("waiter got %+v, want ErrFetchPanicked", r)
	}
	if g.size() != 0 {
		t.Fatal("a panicking fetch left its key behind")
	}
	go gt.release(3)
	if r, _, err := g.Do("k", f); err != nil || string(r) != "3" {
		t.Fatalf("after the panic: %q, %v", r, err)
	}
}

// registerModel is a per-key register: get returns the last value set, or
// "" when none. Inputs and outputs are regOp and string.
type regOp struct {
	get bool
	key string
	val string
}

var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(regOp).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regOp)
		if in.get {
			return output.(string) == state.(string), state
		}
		return true, in.val
	},
}

// The join rule is what makes coalesced reads linearizable: with it the
// history below is linearizable, and with readers allowed to join a fetch
// already in flight it is not. The interleaving is forced step by step, so
// the broken mode fails every time.
func TestJoinRuleLinearizable(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		t.Run(fmt.Sprintf("unsafe=%v", unsafe), func(t *testing.T) {
			g := NewGroup(Options{unsafeJoinInFlight: unsafe})
			var mu sync.Mutex
			reg := "v1"
			clock := atomic.Int64{}
			tick := func() int64 { return clock.Add(1) }
			read := func(int) ([]byte, error) {
				mu.Lock()
				defer mu.Unlock()
				return []byte(reg), nil
			}
			gt := newGates()
			f := gt.fetch(read)
			var ops []porcupine.Operation
			var opsMu sync.Mutex
			record := func(client int, in regOp, call int64, out string) {
				opsMu.Lock()
				ops = append(ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: tick()})
				opsMu.Unlock()
			}
			record(0, regOp{key: "k", val: "v1"}, tick(), "")

			// Reader A's fetch reads v1; its reply is still on the way.
			aCall := tick()
			a := doAsync(g, "k", f)
			gt.waitStarted(t, 1)
			// Writer W sets v2 and is acknowledged.
			wCall := tick()
			mu.Lock()
			reg = "v2"
			mu.Unlock()
			record(1, regOp{key: "k", val: "v2"}, wCall, "")
			// Reader B starts after W's acknowledgement.
			bCall := tick()
			b := doAsync(g, "k", f)
			redistest.Eventually(t, 5*time.Second, func() bool {
				_, next, iw, _ := g.state("k")
				return next || iw == 1
			}, "B never reached the group")
			gt.release(1)
			ra := <-a
			record(2, regOp{get: true, key: "k"}, aCall, ra.reply)
			if !unsafe {
				gt.waitStarted(t, 2)
				gt.release(2)
			}
			rb := <-b
			record(3, regOp{get: true, key: "k"}, bCall, rb.reply)

			ok := porcupine.CheckOperations(registerModel, ops)
			if unsafe && ok {
				t.Fatalf("broken join rule: B read %q after W's ack, yet the check passed", rb.reply)
			}
			if !unsafe && !ok {
				t.Fatalf("join rule: history not linearizable (A=%q B=%q)", ra.reply, rb.reply)
			}
		})
	}
}

// BenchmarkGroupDoAlone is the group's cost for a read with no one to
// share it, what every lone GET pays with coalescing on.
func BenchmarkGroupDoAlone(b *testing.B) {
	g := NewGroup(Options{})
	reply := []byte("$1\r\nv\r\n")
	fetch := func() ([]byte, error) { return reply, nil }
	key := []byte("r20:*2\r\n$3\r\nGET\r\n$16\r\nkey:000000012345\r\n")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := g.do(key, nil, fetch); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGroupReusedEntriesKeepRepliesApart drives many readers of a few keys
// at once, each fetch writing its key into the leader's own buffer as
// Protection's does (Fetcher's dst), and each reader scribbling over its
// buffer once it has its reply. Entries of lone reads are reused at once,
// so a reply read from a recycled entry, or a waiter handed the leader's
// buffer rather than a copy, shows up as another key's reply or as a
// scribbled one. In the unsafe mode readers also join the first fetch of
// an entry, whose entry must then not be reused.
func TestGroupReusedEntriesKeepRepliesApart(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		t.Run(fmt.Sprintf("unsafe=%v", unsafe), func(t *testing.T) { testGroupReuse(t, unsafe) })
	}
}

func testGroupReuse(t *testing.T, unsafe bool) {
	g := NewGroup(Options{unsafeJoinInFlight: unsafe})
	const readers, rounds = 16, 2000
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for r := range readers {
		wg.Go(func() {
			buf := make([]byte, 0, 64)
			for i := range rounds {
				key := fmt.Sprintf("k%d", (r+i)%5)
				want := "$" + key
				got, _, err := g.do([]byte(key), nil, func() ([]byte, error) {
					out := append(buf[:0], want...)
					if i%7 == 0 {
						time.Sleep(10 * time.Microsecond) // let others join
					}
					return out, nil
				})
				if err != nil {
					errs <- err
					return
				}
				if string(got) != want {
					errs <- fmt.Errorf("reader %d asked for %s, got %q", r, key, got)
					return
				}
				copy(buf[:cap(buf)], "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := g.size(); n != 0 {
		t.Fatalf("%d keys still in the group after every read returned", n)
	}
	g.mu.Lock()
	free := len(g.free)
	g.mu.Unlock()
	if free == 0 {
		t.Fatal("no entry was kept for reuse: the test did not exercise reuse")
	}
}

// TestGroupKeepsNoHugeKeys checks that the entry of a read with a huge key
// (a GET of a key of 64 KiB) is not kept for reuse with its buffer, while
// a small one is.
func TestGroupKeepsNoHugeKeys(t *testing.T) {
	g := NewGroup(Options{})
	reply := func() ([]byte, error) { return []byte("$-1\r\n"), nil }
	g.do(make([]byte, 64<<10), nil, reply)
	g.do([]byte("small"), nil, reply)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.free) != 1 || cap(g.free[0].key) > maxFreeKeyBytes {
		t.Fatalf("free entries: %d, first key buffer %d bytes; want one small one", len(g.free), cap(g.free[0].key))
	}
}

// TestGroupHashCollisions checks the chains of keys that share a hash:
// each key finds its own entry, and removing one keeps the others.
func TestGroupHashCollisions(t *testing.T) {
	g := NewGroup(Options{})
	g.mu.Lock()
	defer g.mu.Unlock()
	a, b, c := g.insert(7, []byte("a")), g.insert(7, []byte("b")), g.insert(7, []byte("c"))
	for _, e := range []*entry{a, b, c} {
		if got := g.lookup(7, e.key); got != e {
			t.Fatalf("lookup(%s) found the entry of %q", e.key, got.key)
		}
	}
	if g.lookup(7, []byte("d")) != nil {
		t.Fatal("a key never inserted was found")
	}
	g.remove(b) // the middle of the chain
	if g.lookup(7, []byte("b")) != nil || g.lookup(7, []byte("a")) != a || g.lookup(7, []byte("c")) != c {
		t.Fatal("removing b from the middle of the chain lost another key")
	}
	g.remove(c) // the head
	if g.lookup(7, []byte("c")) != nil || g.lookup(7, []byte("a")) != a {
		t.Fatal("removing the chain's head lost another key")
	}
	g.remove(a)
	if len(g.keys) != 0 {
		t.Fatalf("map holds %d hashes after every key was removed", len(g.keys))
	}
}

// timeoutErr is an error that is a timeout, as the upstream's reply
// timeout is.
type timeoutErr struct{}

func (timeoutErr) Error() string { return "no reply in time" }
func (timeoutErr) Timeout() bool { return true }

// A fetch in flight that ends in a timeout (the upstream answered nothing
// in its time) ends the fetch collecting behind it with the same error,
// unsent: sent, it waited as long again on the same silent upstream
// (found by a probe: coalesced GETs of a frozen Redis failed at twice
// dead_timeout). Any other error leaves it to be sent (TestLeadCollects
// ReadsBehindIt: the lead's own error).
func TestTimeoutEndsTheFetchCollectingBehindIt(t *testing.T) {
	for _, lead := range []bool{false, true} {
		m := NewMetrics(nil)
		g := NewGroup(Options{Metrics: m})
		var fetches atomic.Int32
		gt := newGates()
		first := gt.fetch(func(int) ([]byte, error) { return nil, fmt.Errorf("wrapped: %w", timeoutErr{}) })
		var a chan result
		var l Lead
		if lead {
			l, _ = g.begin([]byte("k"), m)
		} else {
			a = doAsync(g, "k", first)
			gt.waitStarted(t, 1)
		}
		f := func() ([]byte, error) { fetches.Add(1); return []byte("sent"), nil }
		b := doAsync(g, "k", f)
		redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
		c := doAsync(g, "k", f)
		redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 1 }, "C never joined the next fetch")
		if lead {
			l.End(nil, fmt.Errorf("wrapped: %w", timeoutErr{}))
		} else {
			gt.release(1)
			if r := <-a; !errors.As(r.err, new(timeoutErr)) {
				t.Fatalf("the first fetch's caller got %+v", r)
			}
		}
		for name, ch := range map[string]chan result{"B": b, "C": c} {
			if r := <-ch; !errors.As(r.err, new(timeoutErr)) {
				t.Fatalf("lead %v: %s = %+v, want the timeout of the fetch it collected behind", lead, name, r)
			}
		}
		if n := fetches.Load(); n != 0 {
			t.Fatalf("lead %v: %d fetches sent behind a timeout", lead, n)
		}
		if g.size() != 0 {
			t.Fatal("the group keeps state after its fetches returned")
		}
		// The next read is sent.
		if r, _, err := g.Do("k", f); err != nil || string(r) != "sent" {
			t.Fatalf("after the timeout: %q, %v", r, err)
		}
	}
}
