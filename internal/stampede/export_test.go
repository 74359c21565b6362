package stampede

import "testing"

// SetTestHooks makes every Group created afterwards (including a proxy's)
// join fetches already in flight when unsafeJoinInFlight, and runs
// afterFetch between a fetch's return and its waiters being woken. Tests
// using it must not run in parallel with each other.
func SetTestHooks(t testing.TB, unsafeJoinInFlight bool, afterFetch func(key string)) {
	hooks.Store(&testHooks{unsafeJoinInFlight: unsafeJoinInFlight, afterFetch: afterFetch})
	t.Cleanup(func() { hooks.Store(nil) })
}
