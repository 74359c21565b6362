package policy

import "testing"

// TestOptionWordsUpToNUL: Redis reads option words with strcasecmp, which
// stops at the first NUL, so "STORE\x00", "DB\x00x" and "PERSIST\x00" are
// those options (checked against redis-server 7.0.15). The policy
// compared whole arguments and missed them (found by review).
func TestOptionWordsUpToNUL(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	runBatchCases(t, p, []batchCase{
		{"sort store", []string{"SORT p:l STORE\x00 s:d"}, []string{"fixed:ttl expire=[s:d 86400]"}},
		{"copy db", []string{"COPY s:a s:b DB\x00x 3"}, []string{"fixed:ttl expire=[s:b 86400 db=3] expire=[s:b 604800 lt db=3]"}},
		{"getex persist", []string{"GETEX s:k PERSIST\x00"}, []string{"refused:ttl"}},
		{"getex ex", []string{"GETEX s:k EX\x00 99999999"}, []string{"fixed:ttl_max args=[GETEX s:k EX\x00 604800]"}},
		{"set ex", []string{"SET s:k v EX\x00 99999999"}, []string{"fixed:ttl_max args=[SET s:k v EX\x00 604800]"}},
		{"zadd xx", []string{"ZADD l:z XX\x00 1 m"}, []string{""}},
		{"not the option", []string{"SORT p:l STOREX s:d"}, []string{""}},
	})
}
