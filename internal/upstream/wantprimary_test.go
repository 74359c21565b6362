package upstream

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// With WantPrimary a dial reaches only a server that says it is a primary:
// a replica's is refused with ErrNotPrimary and reported as a -READONLY
// would be, on RESP2 (which asks HELLO 2 for it) and RESP3 (HELLO 3's own
// reply), with and without a password.
func TestDialWantPrimaryRefusesAReplica(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	for _, s := range []*redistest.Server{primary, replica} {
		if err := s.Client(t).Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, resp3 := range []bool{false, true} {
		for _, tc := range []struct {
			addr, password string
			primary        bool
		}{{primary.Addr(), "pw", true}, {replica.Addr(), "pw", false}, {primary.Addr(), "", true}, {replica.Addr(), "", false}} {
			var reported atomic.Int32
			opt := Options{Addr: tc.addr, Password: tc.password, RESP3: resp3, DialTimeout: 5 * time.Second,
				Name: "redproxy", WantPrimary: true, OnReadOnly: func() { reported.Add(1) }}
			if tc.password != "" {
				opt.Username = "app"
			}
			nc, err := Dial(opt)
			if nc != nil {
				nc.Close()
			}
			switch {
			case tc.primary && err != nil:
				t.Fatalf("resp3=%v: dial to the primary %s: %v", resp3, tc.addr, err)
			case !tc.primary && (!errors.Is(err, ErrNotPrimary) || !strings.Contains(err.Error(), `"replica"`)):
				t.Fatalf("resp3=%v: dial to the replica: %v, want ErrNotPrimary", resp3, err)
			case !tc.primary && reported.Load() != 1:
				t.Fatalf("resp3=%v: the refused dial was reported %d times, want 1", resp3, reported.Load())
			}
		}
		// Without WantPrimary the replica is dialled as before.
		nc, err := Dial(Options{Addr: replica.Addr(), RESP3: resp3, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("resp3=%v: dial to the replica without WantPrimary: %v", resp3, err)
		}
		nc.Close()
	}
}
