//go:build race

package rawio

// raceEnabled: under the race detector the plain system calls are used,
// because they tell the detector what the kernel wrote and order a write
// before the read of its bytes; raw calls would hide both from it.
const raceEnabled = true
