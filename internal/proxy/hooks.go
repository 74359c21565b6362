package proxy

// Seams of the data path. Each feature owns one file that fills in its
// hooks; the session calls them in this order for every command:
//
//	prepareBatch  once per batch, before any command (guard: decide the batch)
//	guardStep     refuse, rewrite, or add fix-ups          (guard.go)
//	tierStep      answer from the local tier               (tier.go)
//	flightStep    join a coalesced fetch                   (flight.go)
//	writeForwarded a write is about to be sent upstream   (tier.go, flight.go)
//	batchFlushed  the batch's replies are all in           (tier.go, flight.go)
//	sessionClosed the client's connection has ended        (flight.go)
//
// A step returns true when it has recorded the command's reply slot itself.

// initFeatures builds the guard, the stampede group and the local tier from
// the configuration. Each feature's file adds its part.
func (s *Server) initFeatures() error {
	for _, init := range featureInits {
		if err := init(s); err != nil {
			return err
		}
	}
	return nil
}

// featureInits is filled by the features' files in their init functions.
var featureInits []func(*Server) error
