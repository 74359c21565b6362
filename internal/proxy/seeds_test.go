package proxy_test

// Every code pattern of the seed documents (../shared/seeds/000_*.txt, the
// English "redis-patterns" part, and 004_*.txt, the accelerator standard)
// written in Go and run through the proxy against a real redis-server.
// Outcomes are checked on values and counts, and TTLs are read with PTTL on a
// client connected straight to Redis, so what the proxy forwarded is what
// Redis holds.
//
// Not applicable, because they are client configuration rather than commands
// a proxy carries: the seed's connection pool settings (ConnectionPool
// max_connections, timeouts), Cluster mode (RedisCluster) and Sentinel
// (master_for/slave_for), eviction policies (redis.conf), the accelerator
// standard's shutdown ordering (aclose with timeouts) and its test isolation
// switch (TEST_DB_FLAG short-circuits before Redis is reached). The same
// patterns also run against a Redis Cluster behind the proxy
// (seeds_cluster_test.go).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/redproxy/redproxy/internal/seeds"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// seedEnv is one proxy in front of one Redis (or one Redis Cluster),
// shared by the seed patterns; each pattern uses its own keys.
type seedEnv struct {
	p      *proxytest.Proxy
	c      *redis.Client         // through the proxy
	direct redis.UniversalClient // straight to Redis (a cluster client in cluster mode)
	// cluster: the proxy is in cluster mode (seeds_cluster_test.go).
	cluster bool
	// client, if set, opens another client through the proxy, as c is
	// (the namespace tests run the patterns as a proxy user).
	client func(t testing.TB, mutate ...func(*redis.Options)) *redis.Client
}

// newClient opens another client through the proxy, as c is.
func (e *seedEnv) newClient(t testing.TB, mutate ...func(*redis.Options)) *redis.Client {
	if e.client != nil {
		return e.client(t, mutate...)
	}
	return e.p.Client(t, mutate...)
}

// sameSlot returns s as the part of a key that keys derived from it must
// share: in cluster mode a {hash tag}, so that they live in one slot, as a
// Redis Cluster deployment of the pattern needs.
func (e *seedEnv) sameSlot(s string) string {
	if e.cluster {
		return "{" + s + "}"
	}
	return s
}

func newSeedEnv(t *testing.T) *seedEnv {
	p := proxytest.Start(t, nil, nil)
	return &seedEnv{p: p, c: p.Client(t, func(o *redis.Options) { o.PoolSize = 8 }), direct: p.Redis.Client(t)}
}

// pttl reads a key's remaining TTL from Redis itself.
func pttl(t *testing.T, direct redis.Cmdable, key string) time.Duration {
	t.Helper()
	d, err := direct.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return d
}

// wantTTL fails unless key's TTL is in (max-slack, max].
func wantTTL(t *testing.T, direct redis.Cmdable, key string, max time.Duration) {
	t.Helper()
	d := pttl(t, direct, key)
	if d > max || d < max-10*time.Second {
		t.Fatalf("TTL of %s = %v, want about %v", key, d, max)
	}
}

func newUUID(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

type product struct {
	ID    int    `json:"id"`
	Name  string `json:"name"`
	Price int    `json:"price"`
}

// fakeDB stands in for the seeds' relational database and counts queries.
type fakeDB struct {
	mu      sync.Mutex
	rows    map[int]product
	queries atomic.Int64
}

func (d *fakeDB) query(id int) product {
	d.queries.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rows[id]
}

func (d *fakeDB) update(p product) {
	d.mu.Lock()
	d.rows[p.ID] = p
	d.mu.Unlock()
}

func TestSeedPatterns(t *testing.T) {
	newSeedEnv(t).runPatterns(t)
}

// runPatterns runs every pattern of the seed catalogue as a subtest.
func (e *seedEnv) runPatterns(t *testing.T) {
	t.Run("CacheAside", e.cacheAside)
	t.Run("WriteThrough", e.writeThrough)
	t.Run("TagInvalidation", e.tagInvalidation)
	t.Run("Sessions", e.sessions)
	t.Run("FixedWindow", e.fixedWindow)
	t.Run("SlidingWindowLua", e.slidingWindow)
	t.Run("LockWithLuaRelease", e.lock)
	t.Run("PubSubFanOut", e.fanOut)
	t.Run("StreamConsumerGroup", e.streams)
	t.Run("IdempotencySetNXEX", e.idempotency)
	t.Run("CrossProcessInvalidation", e.crossProcessInvalidation)
	t.Run("VersionedKeys", e.versionedKeys)
	t.Run("RateLimitKeyScope", e.rateLimitScope)
	t.Run("StampedeLock", e.stampedeLock)
	t.Run("DataStructureCheatSheet", e.cheatSheet)
}

// Cache-aside: GET; on a miss read the database and SETEX for an hour.
func (e *seedEnv) cacheAside(t *testing.T) {
	db := &fakeDB{rows: map[int]product{123: {ID: 123, Name: "lamp", Price: 40}}}
	getProduct := func(id int) product {
		key := fmt.Sprintf("product:%d", id)
		cached, err := e.c.Get(ctx, key).Result()
		if err == nil {
			var p product
			if err := json.Unmarshal([]byte(cached), &p); err != nil {
				t.Fatalf("cached value is not the JSON we stored: %q", cached)
			}
			return p
		}
		if err != redis.Nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		p := db.query(id)
		b, _ := json.Marshal(p)
		if err := e.c.SetEx(ctx, key, b, 3600*time.Second).Err(); err != nil {
			t.Fatalf("SETEX: %v", err)
		}
		return p
	}
	first := getProduct(123)
	second := getProduct(123)
	if first != db.rows[123] || second != first {
		t.Fatalf("got %+v then %+v, want %+v", first, second, db.rows[123])
	}
	if n := db.queries.Load(); n != 1 {
		t.Fatalf("database queried %d times; the second read must be a cache hit", n)
	}
	wantTTL(t, e.direct, "product:123", time.Hour)
	raw, _ := e.direct.Get(ctx, "product:123").Result()
	if raw != `{"id":123,"name":"lamp","price":40}` {
		t.Fatalf("Redis holds %q", raw)
	}
}

// Write-through: update the database, then SETEX the new value at once.
func (e *seedEnv) writeThrough(t *testing.T) {
	db := &fakeDB{rows: map[int]product{7: {ID: 7, Name: "old", Price: 1}}}
	updateProduct := func(p product) {
		db.update(p)
		b, _ := json.Marshal(p)
		if err := e.c.SetEx(ctx, fmt.Sprintf("product:%d", p.ID), b, 3600*time.Second).Err(); err != nil {
			t.Fatalf("SETEX: %v", err)
		}
	}
	updateProduct(product{ID: 7, Name: "new", Price: 2})
	// Another client of the proxy reads the new value without a DB query.
	other := e.newClient(t)
	v, err := other.Get(ctx, "product:7").Result()
	if err != nil || v != `{"id":7,"name":"new","price":2}` {
		t.Fatalf("GET after write-through: %q %v", v, err)
	}
	if db.queries.Load() != 0 {
		t.Fatal("write-through read went to the database")
	}
	wantTTL(t, e.direct, "product:7", time.Hour)
}

// Tag invalidation: SETEX + SADD tag + EXPIRE tag in one MULTI/EXEC; then
// SMEMBERS the tag, DEL its keys and the tag.
func (e *seedEnv) tagInvalidation(t *testing.T) {
	if e.cluster {
		e.tagInvalidationCrossSlot(t)
		return
	}
	cacheProduct := func(id, category int, p product) {
		key := fmt.Sprintf("product:%d", id)
		tag := fmt.Sprintf("tag:category:%d", category)
		b, _ := json.Marshal(p)
		cmds, err := e.c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.SetEx(ctx, key, b, 3600*time.Second)
			pipe.SAdd(ctx, tag, key)
			pipe.Expire(ctx, tag, 3600*time.Second)
			return nil
		})
		if err != nil {
			t.Fatalf("transaction: %v", err)
		}
		if len(cmds) != 3 || cmds[0].(*redis.StatusCmd).Val() != "OK" || cmds[2].(*redis.BoolCmd).Val() != true {
			t.Fatalf("EXEC results: %v", cmds)
		}
	}
	invalidateCategory := func(category int) {
		tag := fmt.Sprintf("tag:category:%d", category)
		keys, err := e.c.SMembers(ctx, tag).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			if err := e.c.Del(ctx, keys...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.c.Del(ctx, tag).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cacheProduct(201, 9, product{ID: 201})
	cacheProduct(202, 9, product{ID: 202})
	cacheProduct(203, 10, product{ID: 203})
	members, _ := e.direct.SMembers(ctx, "tag:category:9").Result()
	if slices.Sort(members); strings.Join(members, ",") != "product:201,product:202" {
		t.Fatalf("tag members %v", members)
	}
	wantTTL(t, e.direct, "tag:category:9", time.Hour)
	wantTTL(t, e.direct, "product:201", time.Hour)

	invalidateCategory(9)
	if n, _ := e.direct.Exists(ctx, "product:201", "product:202", "tag:category:9").Result(); n != 0 {
		t.Fatalf("%d keys of category 9 survived invalidation", n)
	}
	if n, _ := e.direct.Exists(ctx, "product:203", "tag:category:10").Result(); n != 2 {
		t.Fatal("invalidating category 9 touched category 10")
	}
}

// Sessions: HSET + EXPIRE 86400 in one transaction; HGETALL; DEL.
func (e *seedEnv) sessions(t *testing.T) {
	createSession := func(userID int) string {
		id := newUUID(t)
		key := "session:" + id
		_, err := e.c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.HSet(ctx, key, map[string]any{"user_id": userID, "created_at": time.Now().Unix()})
			pipe.Expire(ctx, key, 86400*time.Second)
			return nil
		})
		if err != nil {
			t.Fatalf("create session: %v", err)
		}
		return id
	}
	getSession := func(id string) map[string]string {
		m, err := e.c.HGetAll(ctx, "session:"+id).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			return nil
		}
		return m
	}
	id := createSession(42)
	s := getSession(id)
	if s["user_id"] != "42" || s["created_at"] == "" {
		t.Fatalf("session %v", s)
	}
	wantTTL(t, e.direct, "session:"+id, 86400*time.Second)
	if getSession(newUUID(t)) != nil {
		t.Fatal("unknown session found")
	}
	if err := e.c.Del(ctx, "session:"+id).Err(); err != nil {
		t.Fatal(err)
	}
	if getSession(id) != nil {
		t.Fatal("deleted session still readable")
	}
}

// Fixed window: INCR + EXPIRE window in one transaction; limited when the
// count exceeds the limit. The window index is fixed for the test so that a
// minute boundary during the run cannot reset the count.
func (e *seedEnv) fixedWindow(t *testing.T) {
	const limit, window = 100, 60
	windowIndex := time.Now().Unix() / window
	isRateLimited := func(userID int) bool {
		key := fmt.Sprintf("ratelimit:%d:%d", userID, windowIndex)
		var incr *redis.IntCmd
		_, err := e.c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			incr = pipe.Incr(ctx, key)
			pipe.Expire(ctx, key, window*time.Second)
			return nil
		})
		if err != nil {
			t.Fatalf("rate limit transaction: %v", err)
		}
		return incr.Val() > limit
	}
	limited := 0
	for i := 0; i < 105; i++ {
		l := isRateLimited(77)
		if l != (i >= limit) {
			t.Fatalf("call %d: limited=%v", i+1, l)
		}
		if l {
			limited++
		}
	}
	if limited != 5 {
		t.Fatalf("%d calls limited, want 5", limited)
	}
	key := fmt.Sprintf("ratelimit:77:%d", windowIndex)
	if v, _ := e.direct.Get(ctx, key).Result(); v != "105" {
		t.Fatalf("counter %q", v)
	}
	wantTTL(t, e.direct, key, window*time.Second)
	if isRateLimited(78) {
		t.Fatal("another user shares the first user's window")
	}
}

// Sliding window: the registered script runs as EVALSHA and falls back to
// EVAL on NOSCRIPT; 100 requests in the window pass, the rest are denied.
func (e *seedEnv) slidingWindow(t *testing.T) {
	if err := e.direct.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(seeds.SlidingWindowScript)
	allowRequest := func(userID int) bool {
		// The script also writes key..":seq", a key it is not given: in
		// cluster mode both must share a slot.
		key := "ratelimit:sliding:" + e.sameSlot(strconv.Itoa(userID))
		now := time.Now().UnixMilli()
		n, err := script.Run(ctx, e.c, []string{key}, now, 60000, 100).Int()
		if err != nil {
			t.Fatalf("sliding window script: %v", err)
		}
		return n == 1
	}
	allowed := 0
	for i := 0; i < 110; i++ {
		ok := allowRequest(5)
		if ok != (i < 100) {
			t.Fatalf("request %d: allowed=%v", i+1, ok)
		}
		if ok {
			allowed++
		}
	}
	if allowed != 100 {
		t.Fatalf("%d allowed", allowed)
	}
	// The first call found no script (NOSCRIPT), loaded it with EVAL, and
	// every later call ran the cached script by its SHA.
	key := "ratelimit:sliding:" + e.sameSlot("5")
	var where redis.Cmdable = e.direct
	if cc, ok := e.direct.(*redis.ClusterClient); ok {
		// EVAL caches the script on the node that ran it only.
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		where = n
	}
	if ex, _ := where.ScriptExists(ctx, script.Hash()).Result(); len(ex) != 1 || !ex[0] {
		t.Fatal("script not cached in Redis after EVAL fallback")
	}
	if n, _ := e.direct.ZCard(ctx, key).Result(); n != 100 {
		t.Fatalf("ZCARD %d", n)
	}
	if v, _ := e.direct.Get(ctx, key+":seq").Result(); v != "100" {
		t.Fatalf("seq %q", v)
	}
	wantTTL(t, e.direct, key, time.Minute)
	wantTTL(t, e.direct, key+":seq", time.Minute)
}

// Lock: SET NX PX acquires; the Lua release deletes only with the owner's token.
func (e *seedEnv) lock(t *testing.T) {
	acquire := func(resource string, ttl time.Duration) string {
		token := newUUID(t)
		ok, err := e.c.SetNX(ctx, "lock:"+resource, token, ttl).Result()
		if err != nil {
			t.Fatalf("SET NX PX: %v", err)
		}
		if !ok {
			return ""
		}
		return token
	}
	release := func(resource, token string) int64 {
		n, err := e.c.Eval(ctx, seeds.ReleaseLockScript, []string{"lock:" + resource}, token).Int64()
		if err != nil {
			t.Fatalf("release: %v", err)
		}
		return n
	}
	token := acquire("order:payment:123", 5000*time.Millisecond)
	if token == "" {
		t.Fatal("lock not acquired")
	}
	if d := pttl(t, e.direct, "lock:order:payment:123"); d <= 0 || d > 5000*time.Millisecond {
		t.Fatalf("lock PTTL %v", d)
	}
	if acquire("order:payment:123", 5*time.Second) != "" {
		t.Fatal("lock acquired twice")
	}
	if n := release("order:payment:123", "not-the-token"); n != 0 {
		t.Fatalf("release with a wrong token returned %d", n)
	}
	if v, _ := e.direct.Get(ctx, "lock:order:payment:123").Result(); v != token {
		t.Fatal("a wrong token released the lock")
	}
	if n := release("order:payment:123", token); n != 1 {
		t.Fatalf("release with the right token returned %d", n)
	}
	if n, _ := e.direct.Exists(ctx, "lock:order:payment:123").Result(); n != 0 {
		t.Fatal("lock still held after release")
	}
	if acquire("order:payment:123", 5*time.Second) == "" {
		t.Fatal("lock not acquirable after release")
	}
}

// Pub/sub fan-out: three subscribers each receive every event, in order.
func (e *seedEnv) fanOut(t *testing.T) {
	const subscribers, events = 3, 20
	var subs []*redis.PubSub
	for i := 0; i < subscribers; i++ {
		ps := e.newClient(t).Subscribe(ctx, "events:fanout")
		t.Cleanup(func() { ps.Close() })
		if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
			t.Fatal(err)
		}
		subs = append(subs, ps)
	}
	for i := 0; i < events; i++ {
		payload, _ := json.Marshal(map[string]int{"seq": i})
		n, err := e.c.Publish(ctx, "events:fanout", payload).Result()
		if err != nil || n != subscribers {
			t.Fatalf("PUBLISH reached %d subscribers (%v), want %d", n, err, subscribers)
		}
	}
	for s, ps := range subs {
		for i := 0; i < events; i++ {
			msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
			if err != nil {
				t.Fatalf("subscriber %d, event %d: %v", s, i, err)
			}
			m, ok := msg.(*redis.Message)
			if !ok {
				t.Fatalf("subscriber %d got %T", s, msg)
			}
			var ev map[string]int
			if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil || ev["seq"] != i || m.Channel != "events:fanout" {
				t.Fatalf("subscriber %d, event %d: %q on %s", s, i, m.Payload, m.Channel)
			}
		}
	}
}

// Streams: XADD MAXLEN ~ 10000; XGROUP CREATE MKSTREAM (BUSYGROUP ignored);
// a consumer blocked in XREADGROUP BLOCK 2000 COUNT 10 wakes for new
// entries, processes and XACKs them; nothing stays pending.
func (e *seedEnv) streams(t *testing.T) {
	const stream, group, events = "events:orders", "processor", 25
	createGroup := func() error {
		return e.c.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	}
	if err := createGroup(); err != nil {
		t.Fatalf("XGROUP CREATE MKSTREAM: %v", err)
	}
	if err := createGroup(); err == nil || !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		t.Fatalf("second XGROUP CREATE: %v, want BUSYGROUP (which the seed ignores)", err)
	}
	consumer := e.newClient(t)
	var processed []string
	done := make(chan error, 1)
	go func() {
		for len(processed) < events {
			res, err := consumer.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: group, Consumer: "worker-1", Streams: []string{stream, ">"}, Count: 10, Block: 2000 * time.Millisecond,
			}).Result()
			if err == redis.Nil {
				continue // the block timed out with nothing new
			}
			if err != nil {
				done <- err
				return
			}
			for _, s := range res {
				if len(s.Messages) > 10 {
					done <- fmt.Errorf("COUNT 10 returned %d entries", len(s.Messages))
					return
				}
				for _, m := range s.Messages {
					processed = append(processed, m.Values["order"].(string))
					if err := consumer.XAck(ctx, stream, group, m.ID).Err(); err != nil {
						done <- err
						return
					}
				}
			}
		}
		done <- nil
	}()
	// Produce only once the consumer is blocked, so the blocking read is
	// what delivers the entries.
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(e.direct) >= 1 }, "consumer never blocked in XREADGROUP")
	for i := 0; i < events; i++ {
		if err := e.c.XAdd(ctx, &redis.XAddArgs{Stream: stream, MaxLen: 10000, Approx: true, Values: map[string]any{"order": strconv.Itoa(i)}}).Err(); err != nil {
			t.Fatalf("XADD: %v", err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("consumer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("consumer did not process every entry")
	}
	for i, v := range processed {
		if v != strconv.Itoa(i) {
			t.Fatalf("processed %v out of order", processed)
		}
	}
	pending, err := e.direct.XPending(ctx, stream, group).Result()
	if err != nil || pending.Count != 0 {
		t.Fatalf("XPENDING after XACK: %+v %v", pending, err)
	}
	if n, _ := e.direct.XLen(ctx, stream).Result(); n != events {
		t.Fatalf("XLEN %d", n)
	}
}

// blockedClients is Redis's count of clients blocked in a command; for a
// cluster client, the sum over the primaries.
func blockedClients(direct redis.UniversalClient) int {
	if cc, ok := direct.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		total := 0
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n := blockedClients(c)
			mu.Lock()
			total += n
			mu.Unlock()
			return nil
		})
		if err != nil {
			return -1
		}
		return total
	}
	info, err := direct.Info(ctx, "clients").Result()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return -1
}

// Idempotency: SET NX EX from 20 concurrent callers; exactly one wins, and
// the key carries its TTL. Repeated on fresh keys to give races a chance.
func (e *seedEnv) idempotency(t *testing.T) {
	const callers, rounds = 20, 10
	clients := make([]*redis.Client, callers)
	for i := range clients {
		clients[i] = e.newClient(t, func(o *redis.Options) { o.PoolSize = 1 })
	}
	for r := 0; r < rounds; r++ {
		key := fmt.Sprintf("cooldown:sms:%d", r)
		start := make(chan struct{})
		var wins atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for i := 0; i < callers; i++ {
			wg.Add(1)
			go func(c *redis.Client) {
				defer wg.Done()
				<-start
				ok, err := c.SetNX(ctx, key, "1", 60*time.Second).Result()
				if err != nil {
					errs <- err
					return
				}
				if ok {
					wins.Add(1)
				}
			}(clients[i])
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if wins.Load() != 1 {
			t.Fatalf("round %d: %d callers won SET NX EX", r, wins.Load())
		}
		wantTTL(t, e.direct, key, time.Minute)
	}
}

// readerProcess is the accelerator standard's read side: a local cache in
// another "process", kept coherent by an invalidation channel. It flushes
// on start (to cover messages missed while it was down) and on each message.
type readerProcess struct {
	c      *redis.Client
	ps     *redis.PubSub
	mu     sync.Mutex
	local  map[string]string
	hits   atomic.Int64
	misses atomic.Int64
	flushN atomic.Int64
	done   chan struct{}
}

func startReader(t *testing.T, c *redis.Client, channel string, stale map[string]string) *readerProcess {
	r := &readerProcess{c: c, local: stale, done: make(chan struct{})}
	r.ps = c.Subscribe(ctx, channel)
	if _, err := r.ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	r.flush() // unconditionally, once subscribed
	go func() {
		defer close(r.done)
		for range r.ps.Channel() {
			r.flush()
		}
	}()
	t.Cleanup(func() { r.ps.Close(); <-r.done })
	return r
}

func (r *readerProcess) flush() {
	r.mu.Lock()
	r.local = map[string]string{}
	r.mu.Unlock()
	r.flushN.Add(1)
}

func (r *readerProcess) get(key string) (string, error) {
	r.mu.Lock()
	v, ok := r.local[key]
	r.mu.Unlock()
	if ok {
		r.hits.Add(1)
		return v, nil
	}
	r.misses.Add(1)
	v, err := r.c.Get(ctx, key).Result()
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	r.local[key] = v
	r.mu.Unlock()
	return v, nil
}

func (r *readerProcess) localLen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.local)
}

// Cross-process invalidation over pub/sub (accelerator standard).
func (e *seedEnv) crossProcessInvalidation(t *testing.T) {
	const channel, key = "cache:invalidate", "states:all:v14"
	if err := e.direct.Set(ctx, key, "v1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	stale := map[string]string{key: "left over from before the restart"}
	r := startReader(t, e.newClient(t), channel, stale)
	if r.localLen() != 0 || r.flushN.Load() != 1 {
		t.Fatal("reader did not flush its local cache on start")
	}
	for i := 0; i < 3; i++ {
		if v, err := r.get(key); err != nil || v != "v1" {
			t.Fatalf("read: %q %v", v, err)
		}
	}
	if r.misses.Load() != 1 || r.hits.Load() != 2 {
		t.Fatalf("misses=%d hits=%d, want 1 and 2", r.misses.Load(), r.hits.Load())
	}
	// The writer process: write, then publish; fire-and-forget.
	writer := e.newClient(t)
	if err := writer.Set(ctx, key, "v2", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := writer.Publish(ctx, channel, `{"reason":"content_publish"}`).Result()
	if err != nil || n != 1 {
		t.Fatalf("PUBLISH reached %d readers (%v)", n, err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return r.flushN.Load() == 2 }, "invalidation never reached the reader")
	if v, err := r.get(key); err != nil || v != "v2" {
		t.Fatalf("read after invalidation: %q %v", v, err)
	}
	if r.misses.Load() != 2 {
		t.Fatal("read after invalidation was served from the stale local cache")
	}
	// The cache still has a TTL, the second safety net of the standard.
	wantTTL(t, e.direct, key, time.Hour)
}

// Versioned keys {module}:{scope}:v{N}: bumping N makes readers ignore the
// old key, which is left to expire by its TTL instead of being deleted.
func (e *seedEnv) versionedKeys(t *testing.T) {
	versionedKey := func(module, scope string, v int) string { return fmt.Sprintf("%s:%s:v%d", module, scope, v) }
	build := func(v int) string { return fmt.Sprintf(`{"shape":%d}`, v) }
	var builds atomic.Int64
	read := func(module, scope string, v int, ttl time.Duration) string {
		key := versionedKey(module, scope, v)
		val, err := e.c.Get(ctx, key).Result()
		if err == nil {
			return val
		}
		if err != redis.Nil {
			t.Fatal(err)
		}
		builds.Add(1)
		val = build(v)
		if err := e.c.Set(ctx, key, val, ttl).Err(); err != nil {
			t.Fatal(err)
		}
		return val
	}
	if k := versionedKey("states", "all", 14); k != "states:all:v14" {
		t.Fatalf("key %q", k)
	}
	// Version 14 is cached with a short TTL so the test can watch it expire.
	if v := read("voice", "all", 14, 300*time.Millisecond); v != build(14) {
		t.Fatal(v)
	}
	if v := read("voice", "all", 14, 300*time.Millisecond); v != build(14) || builds.Load() != 1 {
		t.Fatalf("v14 not served from Redis: %q after %d builds", v, builds.Load())
	}
	// Deploy with the bumped version: the old value is never read.
	if v := read("voice", "all", 15, time.Hour); v != build(15) || builds.Load() != 2 {
		t.Fatalf("v15 read %q after %d builds", v, builds.Load())
	}
	if n, _ := e.direct.Exists(ctx, "voice:all:v14").Result(); n != 1 {
		t.Fatal("old version was deleted by hand; it must expire by TTL")
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		n, _ := e.direct.Exists(ctx, "voice:all:v14").Result()
		return n == 0
	}, "old version never expired")
	if v := read("voice", "all", 15, time.Hour); v != build(15) || builds.Load() != 2 {
		t.Fatal("v15 rebuilt although cached")
	}
}

type request struct{ userID, anonID, ip string }

// scopeKey falls back user > anonymous > IP, as the standard prescribes.
func scopeKey(r request) string {
	switch {
	case r.userID != "":
		return "user:" + r.userID
	case r.anonID != "":
		return "anon:" + r.anonID
	}
	return "ip:" + r.ip
}

// ipKey is for login and anti-brute-force endpoints: a cookie cannot change it.
func ipKey(r request) string { return "ip:" + r.ip }

// Rate-limit key scoping: keys built user > anon > ip, counted with INCR +
// EXPIRE through the proxy, each scope on its own counter.
func (e *seedEnv) rateLimitScope(t *testing.T) {
	reqs := []struct {
		r    request
		want string
	}{
		{request{userID: "u1", anonID: "a1", ip: "10.0.0.1"}, "user:u1"},
		{request{anonID: "a1", ip: "10.0.0.1"}, "anon:a1"},
		{request{ip: "10.0.0.1"}, "ip:10.0.0.1"},
	}
	hit := func(scope string) int64 {
		key := "ratelimit:" + scope
		var incr *redis.IntCmd
		if _, err := e.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			incr = p.Incr(ctx, key)
			p.Expire(ctx, key, time.Minute)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return incr.Val()
	}
	for i, c := range reqs {
		if got := scopeKey(c.r); got != c.want {
			t.Fatalf("scopeKey(%+v) = %q, want %q", c.r, got, c.want)
		}
		for n := 1; n <= i+1; n++ {
			if got := hit(scopeKey(c.r)); got != int64(n) {
				t.Fatalf("%s count %d, want %d", c.want, got, n)
			}
		}
	}
	// Login counts by IP whoever the user is: the three requests share one.
	for i, c := range reqs {
		if got := hit("login:" + ipKey(c.r)); got != int64(i+1) {
			t.Fatalf("login counter %d, want %d", got, i+1)
		}
	}
	for _, k := range []string{"ratelimit:user:u1", "ratelimit:anon:a1", "ratelimit:ip:10.0.0.1", "ratelimit:login:ip:10.0.0.1"} {
		wantTTL(t, e.direct, k, time.Minute)
	}
}

// Cache miss stampede prevention (the seed's get_with_lock): one in-process
// lock per key and a re-check after taking it, so concurrent misses
// fetch once.
func (e *seedEnv) stampedeLock(t *testing.T) {
	var locksMu sync.Mutex
	locks := map[string]*sync.Mutex{}
	var fetches atomic.Int64
	getWithLock := func(key string, ttl time.Duration) (string, error) {
		if v, err := e.c.Get(ctx, key).Result(); err == nil {
			return v, nil
		} else if err != redis.Nil {
			return "", err
		}
		locksMu.Lock()
		l, ok := locks[key]
		if !ok {
			l = &sync.Mutex{}
			locks[key] = l
		}
		locksMu.Unlock()
		l.Lock()
		defer l.Unlock()
		if v, err := e.c.Get(ctx, key).Result(); err == nil {
			return v, nil
		} else if err != redis.Nil {
			return "", err
		}
		fetches.Add(1)
		v := `{"report":"expensive"}`
		return v, e.c.SetEx(ctx, key, v, ttl).Err()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := getWithLock("report:daily", 300*time.Second)
			if err != nil || v != `{"report":"expensive"}` {
				errs <- fmt.Errorf("%q %v", v, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if fetches.Load() != 1 {
		t.Fatalf("%d fetches for one key", fetches.Load())
	}
	wantTTL(t, e.direct, "report:daily", 300*time.Second)
}

// The seed's data structure cheat sheet: leaderboard, unique visitors,
// activity feed, page-view HyperLogLog.
func (e *seedEnv) cheatSheet(t *testing.T) {
	c := e.c
	for i, name := range []string{"ann", "bob", "cat"} {
		c.ZAdd(ctx, "scores:weekly", redis.Z{Score: float64(10 * (i + 1)), Member: name})
	}
	c.ZIncrBy(ctx, "scores:weekly", 25, "ann")
	top, err := c.ZRevRangeWithScores(ctx, "scores:weekly", 0, 1).Result()
	if err != nil || len(top) != 2 || top[0].Member != "ann" || top[0].Score != 35 || top[1].Member != "cat" {
		t.Fatalf("leaderboard %v %v", top, err)
	}
	c.SAdd(ctx, "visitors:2024-01-01", "u1", "u2", "u1")
	if n, _ := c.SCard(ctx, "visitors:2024-01-01").Result(); n != 2 {
		t.Fatalf("unique visitors %d", n)
	}
	for i := 0; i < 5; i++ {
		c.LPush(ctx, "feed:user:456", "post"+strconv.Itoa(i))
	}
	c.LTrim(ctx, "feed:user:456", 0, 2)
	if feed, _ := c.LRange(ctx, "feed:user:456", 0, -1).Result(); strings.Join(feed, ",") != "post4,post3,post2" {
		t.Fatalf("feed %v", feed)
	}
	for i := 0; i < 1000; i++ {
		c.PFAdd(ctx, "hll:pageviews", "visitor"+strconv.Itoa(i%400))
	}
	if n, _ := c.PFCount(ctx, "hll:pageviews").Result(); math.Abs(float64(n)-400) > 20 {
		t.Fatalf("HyperLogLog estimate %d for 400 uniques", n)
	}
}

// Fault degradation (accelerator standard): every cache call is wrapped;
// when Redis is down the wrapper logs and returns nothing, and the caller
// goes to the database. Through the proxy the failure must be prompt.
func TestSeedCacheDegradesWhenRedisIsDown(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	c := p.Client(t, func(o *redis.Options) { o.ReadTimeout = 3 * time.Second })
	var warnings atomic.Int64
	cacheGet := func(key string) (string, bool) {
		v, err := c.Get(ctx, key).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) {
				warnings.Add(1) // logger.warning("cache_get_failed") in the seed
			}
			return "", false
		}
		return v, true
	}
	cacheSet := func(key, v string) {
		if err := c.Set(ctx, key, v, time.Minute).Err(); err != nil {
			warnings.Add(1)
		}
	}
	db := &fakeDB{rows: map[int]product{1: {ID: 1, Name: "db"}}}
	load := func() string {
		if v, ok := cacheGet("product:1"); ok {
			return v
		}
		b, _ := json.Marshal(db.query(1))
		cacheSet("product:1", string(b))
		return string(b)
	}
	want := `{"id":1,"name":"db","price":0}`
	if load() != want || load() != want || db.queries.Load() != 1 {
		t.Fatalf("with Redis up: %d queries", db.queries.Load())
	}
	rs.Kill(t)
	start := time.Now()
	if v := load(); v != want {
		t.Fatalf("degraded read %q", v)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("degraded read took %v; the proxy must fail fast", time.Since(start))
	}
	if db.queries.Load() != 2 || warnings.Load() != 2 {
		t.Fatalf("queries=%d warnings=%d, want 2 and 2 (get and set both failed softly)", db.queries.Load(), warnings.Load())
	}
}
