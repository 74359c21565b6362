package policy

import "testing"

func BenchmarkCheckBatchClean(b *testing.B) {
	p := compileDoc(b, ttlDoc+`
[policy.names]
namespaces = ["session", "s"]
[policy.values]
`)
	reqs := batch("GET session:1", "SET session:1 v EX 100", "HSET s:x f v", "EXPIRE s:x 100")
	var out []Decision
	b.ReportAllocs()
	for b.Loop() {
		out = p.CheckBatch(reqs, out)
	}
}

func BenchmarkCheckBatchDefault(b *testing.B) {
	p := compileDoc(b, "")
	reqs := batch("GET session:1", "SET session:1 v EX 100", "HSET s:x f v", "EXPIRE s:x 100")
	var out []Decision
	b.ReportAllocs()
	for b.Loop() {
		out = p.CheckBatch(reqs, out)
	}
}

// BenchmarkCheckBatchLoneGet is the batch of a client at redis-benchmark's
// default -P 1: one read, default policy.
func BenchmarkCheckBatchLoneGet(b *testing.B) {
	p := compileDoc(b, "")
	reqs := batch("GET key:000000012345")
	var out []Decision
	b.ReportAllocs()
	for b.Loop() {
		out = p.CheckBatch(reqs, out)
	}
}
