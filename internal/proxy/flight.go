package proxy

import (
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
)

// flightStep lets a read join a coalesced fetch. alone is true when the
// command is the only one in its batch.
func (sess *Session) flightStep(cmd *commands.Command, req *resp.Request, m *metrics.Command, alone bool) bool {
	return false
}

// writeForwarded is called for every write before it is sent upstream.
func (sess *Session) writeForwarded(cmd *commands.Command, args [][]byte) {}

// batchFlushed is called when every reply of the batch has arrived.
func (sess *Session) batchFlushed() {}

// sessionClosed is called once when the client's connection ends.
func (sess *Session) sessionClosed() {}
