package policy

import "testing"

// benchCheckBatch measures CheckBatch of the batch lines under the policy
// doc.
func benchCheckBatch(b *testing.B, doc string, lines ...string) {
	p := compileDoc(b, doc)
	reqs := batch(lines...)
	var out []Decision
	b.ReportAllocs()
	for b.Loop() {
		out = p.CheckBatch(reqs, out)
	}
}

func BenchmarkCheckBatchClean(b *testing.B) {
	benchCheckBatch(b, ttlDoc+`
[policy.names]
namespaces = ["session", "s"]
[policy.values]
`, "GET session:1", "SET session:1 v EX 100", "HSET s:x f v", "EXPIRE s:x 100")
}

func BenchmarkCheckBatchDefault(b *testing.B) {
	benchCheckBatch(b, "", "GET session:1", "SET session:1 v EX 100", "HSET s:x f v", "EXPIRE s:x 100")
}

// BenchmarkCheckBatchLoneGet is the batch of a client at redis-benchmark's
// default -P 1: one read, default policy.
func BenchmarkCheckBatchLoneGet(b *testing.B) {
	benchCheckBatch(b, "", "GET key:000000012345")
}

// BenchmarkCheckBatchFixedSet is a SET the policy gives its TTL (enforce,
// with a default): a fix-up on every such write in production.
func BenchmarkCheckBatchFixedSet(b *testing.B) {
	benchCheckBatch(b, ttlDoc, "SET s:user:12345 v")
}

// BenchmarkCheckBatchReportedMSet is an MSET of ten keys that break a TTL
// rule and a naming rule, both in report mode, as in staging.
func BenchmarkCheckBatchReportedMSet(b *testing.B) {
	benchCheckBatch(b, `
[policy]
mode = "report"
[[policy.ttl]]
pattern = "*"
required = true
[policy.names]
namespaces = ["app"]
`, "MSET key:1 v key:2 v key:3 v key:4 v key:5 v key:6 v key:7 v key:8 v key:9 v key:10 v")
}
