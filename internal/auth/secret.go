package auth

import (
	"crypto/sha256"
	"crypto/subtle"
)

// SecretEqual reports whether got is the secret want, in time that depends
// on neither's content nor length: subtle.ConstantTimeCompare returns at
// once when the lengths differ, which let a client time its way to a
// password's or token's length; the digests it compares here are always
// 32 bytes.
func SecretEqual(got, want []byte) bool {
	g, w := sha256.Sum256(got), sha256.Sum256(want)
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}
