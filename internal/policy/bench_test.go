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

// BenchmarkCheckBatchFixedSet is a SET the policy gives its TTL (enforce,
// with a default): a fix-up on every such write in production.
func BenchmarkCheckBatchFixedSet(b *testing.B) {
	p := compileDoc(b, ttlDoc)
	reqs := batch("SET s:user:12345 v")
	var out []Decision
	b.ReportAllocs()
	for b.Loop() {
		out = p.CheckBatch(reqs, out)
	}
}

// BenchmarkCheckBatchReportedMSet is an MSET of ten keys that break a TTL
// rule and a naming rule, both in report mode, as in staging.
func BenchmarkCheckBatchReportedMSet(b *testing.B) {
	p := compileDoc(b, `
[policy]
mode = "report"
[[policy.ttl]]
pattern = "*"
required = true
[policy.names]
namespaces = ["app"]
`)
	reqs := batch("MSET key:1 v key:2 v key:3 v key:4 v key:5 v key:6 v key:7 v key:8 v key:9 v key:10 v")
	var out []Decision
	b.ReportAllocs()
	for b.Loop() {
		out = p.CheckBatch(reqs, out)
	}
}
