package localcache

// Stale-if-error. When the fill connection of a database is lost, its
// entries are dropped (C4). For keys matching a stale_if_error rule they are
// moved aside instead, with a deadline of loss time + max_age. A read of
// such a key while the tier cannot serve is still sent to Redis first; only
// if the proxy's shared connection fails too (ErrUnavailable, ErrConnLost,
// ErrTimeout) is the read answered with the value moved aside, and counted
// in redproxy_localcache_stale_serves_total. This deliberately gives up C4
// for those keys, and only for them: an operator who lists a pattern says
// an old value beats an error for it. A value moved aside is dropped as soon
// as the key is written through the proxy, invalidated, refilled, or its
// deadline passes, and on reconnection; a fence (a write whose keys the
// proxy cannot name) outdates every value moved aside before it, and none
// is moved aside while a fence is unanswered, since the invalidations it
// waits for may not have come.

type aside struct {
	at    int64 // nanotime it was moved aside: a later fence outdates it
	until int64 // nanotime
	vals  [2]map[string][]byte
	size  int64 // bytes charged, the same as the entries it was made from
}

func newAside(rec *keyRec, at, until int64) *aside {
	a := &aside{at: at, until: until, size: rec.size + rec.keyCharge()}
	for p := range rec.entries {
		for raw, e := range rec.entries[p] {
			if a.vals[p] == nil {
				a.vals[p] = map[string][]byte{}
			}
			a.vals[p][raw] = e.val
		}
	}
	return a
}

func (a *aside) has(p int, raw []byte, now int64) bool {
	_, ok := a.vals[p][string(raw)]
	return ok && now < a.until
}

// dropAside forgets a key's stale values; the shard's lock is held.
func (c *Cache) dropAside(rec *keyRec) {
	if rec.aside != nil {
		c.used.Add(-rec.aside.size)
		rec.aside = nil
	}
}

// staleRule returns the first stale_if_error rule matching key, or nil.
func (c *Cache) staleRule(key []byte) *StaleRule {
	for i := range c.cfg.StaleIfError {
		if matchGlob(c.cfg.StaleIfError[i].Pattern, key) {
			return &c.cfg.StaleIfError[i]
		}
	}
	return nil
}

// StaleValue returns the value moved aside for the read, if it is still
// within its rule's max_age, and counts the stale serve. Call it only after
// Redis failed to answer the read (see Stale).
func (c *Cache) StaleValue(db int, resp3 bool, raw, key []byte) ([]byte, bool) {
	h := c.hash(db, key)
	s := c.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[h]
	if rec == nil || !rec.same(db, key) || rec.aside == nil || rec.inflight > 0 {
		return nil, false
	}
	if rec.aside.at <= c.fenceAt.Load() {
		// A write whose keys the proxy could not name (a script) was
		// acknowledged since: the value may be older than it.
		c.dropAside(rec)
		return nil, false
	}
	p := proto(resp3)
	if !rec.aside.has(p, raw, nanotime()) {
		return nil, false
	}
	c.ups[rec.up].m.staleServes.Inc()
	return rec.aside.vals[p][string(raw)], true
}

// Refreshed tells the tier that Redis answered a read it had a stale value
// for, so that value is no longer needed.
func (c *Cache) Refreshed(db int, key []byte) {
	h := c.hash(db, key)
	s := c.shardOf(h)
	s.mu.Lock()
	if rec := s.recs[h]; rec != nil && rec.same(db, key) {
		c.dropAside(rec)
		c.maybeForget(s, rec)
	}
	s.mu.Unlock()
}
