//go:build !race

package resp

const raceOn = false
