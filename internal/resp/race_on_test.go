//go:build race

package resp

// raceOn: sync.Pool drops a quarter of what it is given under the race
// detector, so allocation bounds that rely on reuse are not checked then.
const raceOn = true
