package cluster

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

func shaOf(body string) string {
	sum := sha1.Sum([]byte(body))
	return hex.EncodeToString(sum[:])
}

// The script cache forgets the script used least recently once full, by
// count or by bytes: a stream of one-off EVAL bodies must not keep the
// scripts an application runs by SHA from being healed.
func TestScriptCacheKeepsTheScriptsInUse(t *testing.T) {
	var c scriptCache
	kept := "return redis.call('GET', KEYS[1])"
	c.note("script|load", [][]byte{[]byte("SCRIPT"), []byte("LOAD"), []byte(kept)})
	first := "return 'one-off 0'"
	for i := 0; i < 3*maxScripts; i++ {
		c.note("eval", [][]byte{[]byte("EVAL"), []byte("return 'one-off " + strconv.Itoa(i) + "'"), []byte("0")})
		if i%100 == 0 {
			c.note("evalsha", [][]byte{[]byte("EVALSHA"), []byte(strings.ToUpper(shaOf(kept))), []byte("0")})
		}
	}
	if c.body(shaOf(kept)) == nil {
		t.Fatal("the script run by SHA was forgotten behind one-off EVALs")
	}
	if c.body(shaOf(first)) != nil {
		t.Fatal("the oldest one-off EVAL is still kept past maxScripts")
	}
	last := "return 'one-off " + strconv.Itoa(3*maxScripts-1) + "'"
	if c.body(shaOf(last)) == nil {
		t.Fatal("the newest script was not kept")
	}

	// By bytes: bodies of 1 MB, 16 MB in all.
	big := strings.Repeat("-", 1<<20)
	for i := 0; i < 40; i++ {
		c.note("eval", [][]byte{[]byte("EVAL"), []byte("return 1 " + strconv.Itoa(i) + big), []byte("0")})
	}
	if c.bytes > maxScriptBytes {
		t.Fatalf("the cache holds %d bytes of scripts, over %d", c.bytes, maxScriptBytes)
	}
	if c.body(shaOf("return 1 39"+big)) == nil {
		t.Fatal("the newest large script was not kept")
	}
}
