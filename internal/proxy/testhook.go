package proxy

import "sync/atomic"

// ReplyHook sees one reply from Redis on its way to client clientID and
// returns what the client gets instead. reply is only valid during the call.
type ReplyHook func(clientID int64, reply []byte) []byte

// testHookReply exists for one purpose: the fault suite
// (internal/faultsuite) breaks the proxy on purpose, mixing replies between
// clients, to prove its cross-talk detector fires. Nothing else sets it;
// unset, it costs one atomic load and a nil check per forwarded reply.
var testHookReply atomic.Pointer[ReplyHook]

// SetTestReplyHook installs h for every server in the process (nil removes
// it) and returns a function that puts the previous hook back. For tests
// only: a proxy with a hook installed hands clients whatever h returns.
func SetTestReplyHook(h ReplyHook) (restore func()) {
	var p *ReplyHook
	if h != nil {
		p = &h
	}
	old := testHookReply.Swap(p)
	return func() { testHookReply.Store(old) }
}
