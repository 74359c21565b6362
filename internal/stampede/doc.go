// Package stampede protects Redis from many clients asking for the same thing
// at once. The proxy sees every client, so it can do for all of them what
// applications otherwise do, badly, with in-process locks.
//
// # Coalescing (Group)
//
// Identical reads (same DB, protocol and command bytes) share one upstream
// request. The rule that keeps this linearizable: a read may join only a
// fetch that is sent upstream after the read arrived. If a fetch for the key
// is already in flight, a new read does not join it; it waits for the next
// fetch, which collects every read arriving meanwhile and is sent as soon as
// the one in flight returns. So per key there is at most one fetch in flight
// and one collecting, and every reply comes from an upstream read that Redis
// executed inside the reader's own time window (after it asked, before it
// was answered), which is exactly what a read sent alone would have seen.
// Joining a fetch already sent would break this: a client that got OK for
// SET k v2 and then read k could join a GET sent before the SET and see the
// old value.
//
// A cap on the waiters of one fetch (as in Vitess's query consolidator)
// sends excess readers straight upstream (ErrTooManyWaiters), each alone
// and, when a miss hold or early refresh rule matches its key, still under
// it. An error reply or a failed fetch is handed to that fetch's waiters
// only and never kept.
// The fetch runs independently of the caller that leads it, so a leader whose
// client disconnects does not fail its waiters.
//
// A read with no fetch of its key in flight or collecting may instead lead
// one that its caller sends itself (Protection.Begin, a Lead): the proxy
// sends the read on the client's own upstream Call, and whoever completes
// that Call ends the Lead (Lead.End), which lets the fetch collecting
// behind it go. No one joins a Lead, which is a fetch in flight from the
// start, so the rule above holds unchanged; what it saves is the leader's
// goroutine waiting for the reply (the proxy's direct replies).
//
// The proxy coalesces a read only when it is the only command in its
// client's batch. A coalesced read executes at the fetch's time, possibly on
// another upstream connection than the rest of the client's commands; if the
// same client had pipelined SET a 1, GET b, the SET would travel on the
// client's own Call while GET b joined someone else's fetch, and Redis could
// run GET b before SET a. Another client that writes b and then reads a
// could then observe an order that Redis never shows one connection. Alone
// in its batch, a read has nothing of its own client to be reordered with.
// For the same reason the proxy never coalesces for a client inside MULTI,
// holding a WATCH, or in subscribed mode: those clients talk to a dedicated
// connection.
//
// # Miss hold (Misses, opt-in per key pattern)
//
// When a GET of a key matching a hold pattern returns nil, the first client
// to get the nil becomes the filler: it is expected to compute the value and
// write it. GETs of that key from other clients during the hold timeout are
// held instead of sent. The hold ends when a write to the key passes through
// the proxy and its reply has come back, when the filler's connection
// closes, or when the timeout runs out, whichever comes first; the held
// reads are then released into the coalescing group, as fresh reads (never
// handed the written value directly, since another write may have landed
// since): a fetch a released read leads or joins is sent after the release,
// and every held read arrived before it, so this too returns what Redis
// holds inside each reader's window. The group's cap applies to them as to
// any read (a released read past MaxWaiters is sent alone), and they count
// as coalesced reads. A held client never waits longer than the hold
// timeout, and one that leaves meanwhile (Read's gone) stops waiting and
// its session ends, as for a client blocked in BLPOP.
//
// # Early refresh (Misses, opt-in per key pattern)
//
// XFetch (Vattani, Chierichetti and Lowenstein, "Optimal Probabilistic Cache
// Stampede Prevention", VLDB 2015): GETs of a matching key fetch PTTL with
// the value, so the proxy knows the time to expiry τ. It measures, per
// pattern, δ: the time from a miss handed to a client until that key is
// written through the proxy (an EWMA), i.e. how long recomputing takes. A
// reader is handed a miss early when
//
//	now − δ·β·ln(rand()) ≥ expiry        (equivalently rand() ≤ exp(−τ/(β·δ)))
//
// with rand() uniform in (0,1]. Only one reader per key at a time gets such
// an early miss and becomes the filler; the others keep getting the value,
// so a hot key is recomputed once, shortly before it expires, instead of by
// every reader after. β > 1 refreshes earlier, β < 1 later. This mode
// deliberately answers nil for a key that still exists (as if it had expired
// a little early), so it is opt-in and meant for cache keys only. Only a
// value (a non-nil bulk string) is turned into such a miss: an error reply
// (WRONGTYPE for a key of another type, which may have a TTL too) or any
// other reply is passed on unchanged.
package stampede
