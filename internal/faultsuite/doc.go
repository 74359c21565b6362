// Package faultsuite holds the fault suite: a go test that runs a real
// proxy in front of a real redis-server under a mixed workload (pipelining
// clients, WATCH/MULTI/EXEC transactions, RESP2 and RESP3 subscribers,
// BLPOP consumers, clients exhausting upstream.max_pinned) while Redis
// connections are killed, Redis restarts and Redis freezes, and counts what
// a proxy must never do: hand a client another client's reply, answer a
// client out of order or with a stale value, lose an acknowledged write,
// or leave a client without a reply.
//
// Errors and closed connections during faults are allowed; a wrong value is
// not. A write whose reply never came (an error, a lost connection) is
// modelled as "maybe applied": both outcomes are accepted.
//
// Run it:
//
//	go test -run TestFaultSuite ./internal/faultsuite/
//	REDPROXY_FAULT_DURATION=2m go test -run TestFaultSuite -v ./internal/faultsuite/
//	scripts/fault-suite.sh 10    # ten consecutive runs
//
// The package has no code outside its tests.
package faultsuite
