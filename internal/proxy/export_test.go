package proxy

import (
	"time"

	"github.com/redproxy/redproxy/internal/commands"
)

// ParkedClientsKeepingAWriter counts the parked clients whose connection
// still holds a raw writer, which refers to the net.Conn the client gave up
// when it parked (park.go, detach).
func (s *Server) ParkedClientsKeepingAWriter() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for sess := range s.sessions {
		if sess.park.state.Load() != parkParked {
			continue
		}
		if cc, ok := sess.nc.(*clientConn); ok && cc.sock.Load() != nil {
			n++
		}
	}
	return n
}

// SetParkPressure sets how many clients waiting unparked make the sweeper
// park idle ones early (park.go, parkPressure).
func (s *Server) SetParkPressure(n int) { s.park.pressure.Store(int64(n)) }

// SetParkTickCap sets the longest pause between the sweeper's looks (a
// second otherwise), from the first look that starts after it on.
func (s *Server) SetParkTickCap(d time.Duration) { s.park.tickCap.Store(int64(d)) }

// ParkSweeps is how many times the sweeper has looked.
func (s *Server) ParkSweeps() int64 { return s.park.sweeps.Load() }

// SetBatchLoadThreshold sets how many sessions answering a batch at once
// cap every client's batches (limits.go, loadedSessions).
func (s *Server) SetBatchLoadThreshold(n int) { s.batchLoad.threshold.Store(int32(n)) }

// BatchCap is the cap on clients' batches in force (0: none).
func (s *Server) BatchCap() int { return int(s.batchLoad.cap.Load()) }

// ParkArmed is the pause before the sweeper's next regular look, as its
// last look armed it.
func (s *Server) ParkArmed() time.Duration { return time.Duration(s.park.armed.Load()) }

// ClusterReplicaViewStarted is, in cluster mode with replica reads, when
// the oldest of the shards' current replica views started (zero before
// every shard was polled once): the cluster twin of ReplicaViewStarted,
// since the shards are polled together but each keeps its own view.
func (s *Server) ClusterReplicaViewStarted() time.Time {
	cr := s.creplicas
	if cr == nil {
		return time.Time{}
	}
	var oldest time.Time
	for _, rs := range *cr.sets.Load() {
		v := rs.view.Load()
		if v == nil {
			return time.Time{}
		}
		if oldest.IsZero() || v.at.Before(oldest) {
			oldest = v.at
		}
	}
	return oldest
}

// ClusterReplicaConn is, for the cluster replica at addr, how many times
// the RESP2 pool its reads and polls share has dialled, and whether it is
// connected now; ok is false when no shard's current view has the
// replica.
func (s *Server) ClusterReplicaConn(addr string) (dials uint64, up, ok bool) {
	if s.creplicas == nil {
		return 0, false, false
	}
	for _, rs := range *s.creplicas.sets.Load() {
		v := rs.view.Load()
		if v == nil {
			continue
		}
		for _, vn := range v.nodes {
			if vn.node.addr == addr {
				st, n := vn.node.backend.Pool(0, false).Stats()
				return st.Dials, n > 0, true
			}
		}
	}
	return 0, false, false
}

// SetTestClusterPicked makes f run each time a cluster replica is picked
// for a read, before the read is sent (clusterReads.Replica); nil turns
// it off. It returns a restore.
func SetTestClusterPicked(f func(replica string)) (restore func()) {
	var p *func(string)
	if f != nil {
		p = &f
	}
	old := testClusterPicked.Swap(p)
	return func() { testClusterPicked.Store(old) }
}

// SentinelPrimaryOf returns the primary the named Sentinel upstream's
// watcher knows (after it told the data path), "" if none or no such
// upstream.
func (s *Server) SentinelPrimaryOf(name string) string {
	if s.routes == nil {
		return ""
	}
	for _, t := range s.routes.targets {
		if t.name == name && t.sentinel != nil {
			return t.sentinel.Primary()
		}
	}
	return ""
}

// CommandTable is the command table in force.
func (s *Server) CommandTable() *commands.Table { return s.tableInForce() }

// SetFileLimit stands in for the process's file descriptor limit, which
// bounds max_clients (0: none known).
func (s *Server) SetFileLimit(n int) { s.fileLimit.Store(int64(n)) }

// FDReserve is how many descriptors the limit keeps past one per client
// and upstream.max_pinned.
const FDReserve = fdReserve
