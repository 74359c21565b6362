// Package seeds holds the Lua scripts of the seed documents
// (../shared/seeds), exactly as applications run them, so that every test
// that checks a seed pattern through the proxy runs the same text.
package seeds

// SlidingWindowScript is the seeds' sliding-window rate limiter: KEYS[1]
// is the window's sorted set, ARGV now (ms), window (ms) and limit.
const SlidingWindowScript = `-- sliding_window.lua
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local count = redis.call('ZCARD', key)
if count < limit then
-- Use unique member (now + sequence) to avoid collisions within the same millisecond
local seq_key = key .. ':seq'
local seq = redis.call('INCR', seq_key)
redis.call('EXPIRE', seq_key, math.ceil(window / 1000))
redis.call('ZADD', key, now, now .. '-' .. seq)
redis.call('EXPIRE', key, math.ceil(window / 1000))
return 1
end
return 0
`

// ReleaseLockScript is the seeds' lock release: it deletes KEYS[1] only if
// it still holds the caller's token ARGV[1].
const ReleaseLockScript = `
if redis.call('get', KEYS[1]) == ARGV[1] then
return redis.call('del', KEYS[1])
else
return 0
end
`
