package config

import (
	"fmt"
	"time"
)

// upstream.read_from values: where read-only commands go.
const (
	// ReadPrimary sends every command to the primary (the default).
	ReadPrimary = "primary"
	// ReadReplica sends reads to replicas only; with none usable, a read
	// fails rather than loading the primary.
	ReadReplica = "replica"
	// ReadReplicaPreferred sends reads to a replica when one is usable,
	// else to the primary.
	ReadReplicaPreferred = "replica_preferred"
)

// minReplicaPoll bounds how often the replicas' offsets are read: each poll
// is an INFO on the primary and on every replica.
const minReplicaPoll = 10 * time.Millisecond

// replicaDefaults sets the replica-read settings of an upstream section
// to their defaults: reads from the primary.
func replicaDefaults(u *Upstream) {
	u.ReadFrom = ReadPrimary
	u.MaxReplicaLag = dur(time.Second)
	u.ReplicaPollInterval = dur(100 * time.Millisecond)
}

// checkReplicaReads checks the replica-read settings of one upstream
// section, whose dotted prefix is section ("upstream", or a named
// upstream's "upstreams.NAME").
func checkReplicaReads(section string, u *Upstream) []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: section + "." + key, Msg: fmt.Sprintf(format, args...)})
	}
	switch u.ReadFrom {
	case ReadPrimary, ReadReplica, ReadReplicaPreferred:
	default:
		bad("read_from", "invalid value %q (use %q, %q or %q)", u.ReadFrom, ReadPrimary, ReadReplica, ReadReplicaPreferred)
	}
	if u.ReadFrom != ReadPrimary && u.Address == EmbeddedAddress {
		bad("read_from", "the in-process demo store has no replicas (use %q)", ReadPrimary)
	}
	if u.MaxReplicaLag.Duration <= 0 {
		bad("max_replica_lag", "must be > 0, got %v", u.MaxReplicaLag)
	}
	if u.ReplicaPollInterval.Duration < minReplicaPoll {
		bad("replica_poll_interval", "must be at least %v, got %v", minReplicaPoll, u.ReplicaPollInterval)
	}
	return errs
}
