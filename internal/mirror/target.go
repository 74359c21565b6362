package mirror

import (
	"bytes"
	"sync"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Target is where the mirror sends: the connections of a standalone or
// Sentinel upstream (BackendTarget), or a Redis Cluster (RouterTarget).
type Target interface {
	// Do sends c's commands, run in database db with protocol resp3, and
	// waits for their replies. An error means nothing was sent.
	Do(db int, resp3 bool, c *upstream.Call) error
	// Close ends the target's connections; a Do in flight fails at once.
	Close()
}

// BackendTarget sends on b's shared connections, one per database and
// protocol. onClose runs after b is closed (a Sentinel watcher that moves
// b to each new primary stops there).
func BackendTarget(b *upstream.Backend, onClose func()) Target {
	return &backendTarget{b: b, onClose: onClose}
}

type backendTarget struct {
	b       *upstream.Backend
	onClose func()
	once    sync.Once
}

func (t *backendTarget) Do(db int, resp3 bool, c *upstream.Call) error {
	if err := t.b.Pool(db, resp3).Send(c); err != nil {
		return err
	}
	c.Wait()
	return nil
}

// Close may be called more than once (Mirror.Close does: once to end a
// wait, once after the sender stopped); onClose runs the first time.
func (t *backendTarget) Close() {
	if t.onClose != nil {
		t.once.Do(t.onClose) // first: a failover must not move a closed Backend
	}
	t.b.Close()
}

// RouterTarget sends through a cluster Router: each command to the node
// owning its key's slot, multi-key commands split where Redis Cluster
// splits them (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH), MOVED and ASK
// followed, NOSCRIPT answered with the script the router saw. A cluster
// has database 0 only (Options.Databases = 1). The router's table
// (Router.Table) parses commands for the slot check of transactions.
func RouterTarget(r *cluster.Router) Target {
	return &routerTarget{r: r}
}

type routerTarget struct {
	r *cluster.Router

	args [][]byte // scratch, sender goroutine only
	keys []int
}

func (t *routerTarget) Do(_ int, resp3 bool, c *upstream.Call) error {
	if !t.r.Ready() {
		return upstream.ErrUnavailable
	}
	t.r.Do(c, resp3)
	return nil
}

func (t *routerTarget) Close() { t.r.Close() }

// crossSlot reports whether the parts of one mirrored command (a
// transaction, or a write wrapped with its fix-ups) name keys of more than
// one slot: one node cannot run them together.
func (t *routerTarget) crossSlot(e *entry, first, n int) bool {
	slot := -1
	for p := first; p < first+n; p++ {
		var err error
		t.args, err = resp.SplitCommand(e.part(p), t.args[:0])
		if err != nil || len(t.args) == 0 {
			continue
		}
		cmd := t.r.Table().Lookup(t.args)
		if cmd == nil {
			continue
		}
		t.keys = cluster.SlotArgs(cmd, t.args, t.keys[:0])
		for _, k := range t.keys {
			switch s := cluster.Slot(t.args[k]); {
			case slot < 0:
				slot = s
			case s != slot:
				return true
			}
		}
	}
	return false
}

// refused reports whether reply is the router's own refusal of a
// cross-slot command it cannot split (nothing was sent).
func (t *routerTarget) refused(reply []byte) bool { return bytes.Equal(reply, cluster.CrossSlot()) }
