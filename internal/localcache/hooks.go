package localcache

import "sync/atomic"

// TestHooks deliberately weaken or slow the tier, so tests can show that
// their checks fail when the coherence machinery is broken, and can hold a
// fill in flight. They apply to every Cache in the process; production code
// never sets them.
type TestHooks struct {
	// IgnorePushes drops every invalidation push.
	IgnorePushes bool
	// SkipGenerationCheck stores fills even if the key was invalidated,
	// flushed or written while they were in flight.
	SkipGenerationCheck bool
	// DropHeartbeats ignores heartbeat replies, as if the connection were
	// black-holed: the tier stops serving within S.
	DropHeartbeats bool
	// FenceWrites handles ordinary writes with a fence after their reply
	// instead of marking their keys in flight (the alternative measured by
	// BenchmarkWriteModes).
	FenceWrites bool
	// AfterFill runs when a fill's reply has arrived, before it is stored.
	AfterFill func(key []byte)
	// BeforePush runs before an invalidation push is handled, on the
	// connection's reader: a slow invalidation stream.
	BeforePush func()
	// SkipFences makes Fence do nothing.
	SkipFences bool
}

var hooks atomic.Pointer[TestHooks]

// SetTestHooks installs h (nil removes them) and returns the previous ones.
func SetTestHooks(h *TestHooks) *TestHooks { return hooks.Swap(h) }
