package proxy

import (
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
)

// tierStep answers a read from the local tier when it may.
func (sess *Session) tierStep(cmd *commands.Command, req *resp.Request, m *metrics.Command) bool {
	return false
}
