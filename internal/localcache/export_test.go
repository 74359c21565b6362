package localcache

import (
	"testing"
	"time"
)

// SetNotKeptFor makes not_kept notes last d until the test ends. Call it
// before starting the tier: the tier's goroutines read the value.
func SetNotKeptFor(t *testing.T, d time.Duration) {
	old := notKeptFor
	notKeptFor = d
	t.Cleanup(func() { notKeptFor = old })
}
