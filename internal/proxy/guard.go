package proxy

import (
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
)

// prepareBatch lets the guard see the whole batch before any command runs,
// so a write followed by its own EXPIRE in the same batch passes untouched.
func (sess *Session) prepareBatch(reqs []resp.Request) {}

// guardStep applies the guard's decision for request i.
func (sess *Session) guardStep(i int, cmd *commands.Command, req *resp.Request, m *metrics.Command) bool {
	return false
}

// hiddenFailed is told when a fix-up the client never sees failed.
func (sess *Session) hiddenFailed(reply []byte, err error) {}
