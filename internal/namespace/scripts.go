package namespace

import "github.com/redproxy/redproxy/internal/resp"

// flushScript deletes the keys matching ARGV[1] in batches: FLUSHDB for a
// namespace. It runs as one script, so no other client sees half of it,
// and it blocks Redis for as long as the namespace takes to delete.
const flushScript = `local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = r[1]
  local keys = r[2]
  for i = 1, #keys, 500 do
    redis.call('UNLINK', unpack(keys, i, math.min(i + 499, #keys)))
  end
until cursor == '0'
return redis.status_reply('OK')`

// randomKeyScript is RANDOMKEY for a namespace: a few tries of Redis's
// own RANDOMKEY (fast when the namespace holds much of the database), then
// the first non-empty SCAN page of the namespace. ARGV[1] is the MATCH
// pattern, ARGV[2] the prefix.
const randomKeyScript = `for i = 1, 16 do
  local k = redis.call('RANDOMKEY')
  if not k then return false end
  if string.sub(k, 1, #ARGV[2]) == ARGV[2] then return k end
end
local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = r[1]
  if #r[2] > 0 then return r[2][math.random(#r[2])] end
until cursor == '0'
return false`

// FlushDBCommand is the command that runs FLUSHDB within the namespace.
// The slice is shared: do not modify it.
func (ns *Namespace) FlushDBCommand() []byte { return ns.flushCmd }

// RandomKeyCommand is the command that runs RANDOMKEY within the
// namespace; its reply is a key to strip (StripBulk). The slice is shared.
func (ns *Namespace) RandomKeyCommand() []byte { return ns.randomCmd }

func (ns *Namespace) buildScripts() {
	ns.flushCmd = resp.AppendCommandStrings(nil, "EVAL", flushScript, "0", string(ns.matchAll))
	ns.randomCmd = resp.AppendCommandStrings(nil, "EVAL", randomKeyScript, "0", string(ns.matchAll), ns.prefix)
}
