// Package policy decides, for each command passing through redproxy, whether
// it breaks the operator's rules, and what to do about it: refuse it, rewrite
// it, add a TTL fix-up after it, or only report it. It is pure: no I/O, no
// goroutines. The guard applies the decisions; the keyspace audit (package
// audit) uses the same rules on keys already in Redis.
//
// # Modes and actions
//
// Every rule has an action: "enforce" (refuse, rewrite or fix), "report" (log
// and count, forward unchanged) or "off". policy.mode is the default action
// of every rule that does not set its own, and also its ceiling: a rule can
// lower the mode (action = "report" under mode = "enforce"), never raise it,
// so mode = "report" guarantees nothing is refused — the staging setting.
// --policy-mode (Policy.ForcedMode) caps everything once more. Order:
// off < report < enforce.
//
// # Command rules
//
// KEYS, FLUSHALL and FLUSHDB are refused unless listed in [policy.commands]
// allow: they are the seeds' anti-patterns (KEYS blocks Redis, FLUSHALL wipes
// it, FLUSHDB wipes a database), and no application needs them in
// production. So are SHUTDOWN, REPLICAOF, SLAVEOF, FAILOVER, CLUSTER RESET,
// CLUSTER FAILOVER and MODULE LOAD, LOADEX and UNLOAD, which stop Redis or
// change what it is; allowing a container (allow = ["module"]) allows its
// subcommands refused by default, unless the deny list names them. Each
// refusal names the safe alternative, e.g.
//
//	ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100
//
// deny adds commands; allow removes them and wins over deny. Names are
// Redis 7 names, subcommands as "config|set"; denying a container ("script")
// covers its subcommands, and an exact name beats its container, so
// deny = ["script"] with allow = ["script|load"] leaves only SCRIPT LOAD.
// Unknown names are configuration errors (a typo must not silently allow a
// command), except names with a dot, which are module commands.
//
// Nothing else is denied by default, because redproxy must be a drop-in
// proxy: CONFIG SET, DEBUG, SCRIPT FLUSH and FUNCTION FLUSH appear in test
// suites and tooling (SCRIPT FLUSH and FUNCTION FLUSH between tests), and
// Redis 7 already disables DEBUG unless enable-debug-command is set. The
// shipped example config denies DEBUG, SHUTDOWN, MONITOR, SWAPDB,
// REPLICAOF/SLAVEOF, CLUSTER RESET and CONFIG SET for production.
//
// # TTL rules
//
// [[policy.ttl]] rules match keys with Redis glob patterns (the syntax of
// SCAN MATCH); the first matching rule in document order applies, so put
// specific patterns before general ones ("*" last). A rule with neither
// required nor max exempts its keys from the rules after it.
//
// required = true: a write that could leave the key without a TTL — it
// creates the key, or replaces its value and so drops its TTL — is a
// violation unless a later command of the same batch gives the key a TTL. The
// effect of every key-creating or TTL-changing Redis 7 command is classified
// in effects.go (SET and its options, SETNX, GETSET, MSET, INCR..., APPEND,
// SETRANGE, SETBIT, BITFIELD with SET/INCRBY, BITOP, hash, list, set, zset,
// geo, stream and HyperLogLog writes, LMOVE/SMOVE/COPY/RENAME destinations,
// every *STORE destination, SORT ... STORE, RESTORE, PERSIST, GETEX PERSIST);
// a test fails when the command table gains a write command nobody
// classified. Under enforce such a write is:
//
//   - rewritten when the command has a TTL argument: SET k v becomes
//     SET k v EX <default>, RESTORE k 0 ... gets <default> ms;
//   - otherwise followed by EXPIRE k <default> NX (Decision.Expires), which
//     the guard sends on the same upstream connection and whose reply it
//     hides. NX leaves an existing TTL alone, so HSET on a live session does
//     not extend it. This needs Redis 7.0 or later;
//   - refused when the rule has no default (a lock without TTL is a bug, not
//     something to fix silently). PERSIST and GETEX PERSIST of a key a
//     required rule covers are always refused, with a default or without,
//     and whether or not the key has a TTL now: removing the TTL is the
//     point of the command.
//
// Look-ahead: CheckBatch sees a whole pipeline batch or MULTI block. A write
// followed later in it by a command that certainly gives the key a TTL
// passes untouched — the seeds' HSET + EXPIRE session and INCR + EXPIRE
// fixed window. Certainly means all of:
//
//   - the command is EXPIRE, PEXPIRE, EXPIREAT or PEXPIREAT (alone, with NX
//     or with LT: NX and LT always act on a key without TTL), SET with a TTL
//     option and without NX, XX or GET, or SETEX/PSETEX; not EXPIRE XX or
//     GT (they leave a key without TTL alone), not GETEX or SET ... GET
//     (WRONGTYPE on a hash), not RESTORE (BUSYKEY), not a combination of
//     options Redis refuses;
//   - its TTL is a number Redis accepts that neither deletes the key (zero,
//     negative, a time in the past) nor overflows;
//   - it is not refused, by the policy or, before it runs, by the proxy
//     (Request.Denied: the user's ACL), and is the same key in the same
//     database: a COPY ... DB n destination is never covered by a later
//     command;
//   - no boundary lies between the write and it: a command that changes the
//     connection's state (SELECT, MULTI, EXEC, DISCARD, WATCH, QUIT, RESET,
//     HELLO, SUBSCRIBE, CLIENT TRACKING, ...), a blocking command (after
//     which a client that went away gets nothing more sent), a command the
//     proxy runs apart after answering what came before it (SCRIPT KILL,
//     FUNCTION KILL, SHUTDOWN, CLIENT UNBLOCK), SWAPDB or MOVE. So a write and its EXPIRE inside one MULTI block count (they
//     commit or abort together), but a write before MULTI and an EXPIRE
//     queued in it do not (DISCARD, EXECABORT or a WATCH abort would leave
//     the write without TTL).
//
// Anything else gets the fix-up (or, without a default, the refusal). A TTL
// set in an earlier, separate round trip cannot be seen; the NX fix-up then
// does no harm. The fix-up runs before the later command, so that command
// then acts on a key with a TTL: a later EXPIRE ... XX sets its TTL (it
// would do nothing on Redis alone), and an EXPIRE ... NX behind a boundary
// leaves the default in place.
//
// COPY src dst DB n creates dst in database n. Its fix-up is SELECT n,
// EXPIRE dst <default> NX, SELECT <current> — inside the same MULTI/EXEC
// wrapper as the COPY, or queued behind it in the client's MULTI, where
// <current> is the database the client's queued SELECTs left it in. When n
// is not below upstream.databases, Redis refuses the COPY and no fix-up is
// sent.
//
// Commands the effect table does not classify — module commands and those
// newer than the table, known to redproxy from the upstream's COMMAND reply
// — are classified from their key specifications when they are writes:
// every key of a spec flagged OW, or RW with INSERT or UPDATE, is taken as
// created, and the TTL and naming rules apply to it. A command the policy
// cannot fully classify (unknown to the command table, or a write whose key
// specs are incomplete or missing) is reported under the rule
// "unclassified": redproxy_policy_unclassified_total and GET /policy/report.
// Whatever keys its specs or key positions do name are still taken as
// created.
//
// max caps explicit TTLs (SET EX/PX/EXAT/PXAT, SETEX, PSETEX, GETEX, EXPIRE
// family, RESTORE): max_action = "clamp" (default) rewrites the value to max
// in the command's own unit, "refuse" refuses. Absolute times are compared
// with the proxy's clock. Defaults and maxima are whole seconds. A key that
// takes another key's TTL (RENAME, RENAMENX, COPY), unseen here, gets a
// second fix-up after its NX one when its rule has a max: EXPIRE k <max>
// LT, which lowers a longer TTL and keeps a shorter one (the NX fix-up ran
// first, so LT never meets a key without TTL, to which it would give one).
// A rule with a max and no default adds no fix-up, so such a key keeps a
// longer TTL it took over.
//
// What cannot be checked: keys a script (EVAL, EVALSHA, FCALL) writes, since
// the script's effect is unknown — only the names of its declared KEYS are
// checked; keys the script builds itself (the seeds' sliding window
// key .. ':seq') are not even seen. MIGRATE and MOVE carry keys elsewhere with
// their TTL. The keyspace audit (redproxy audit) finds what got through: keys
// without TTL where a rule requires one.
//
// Scripts can also call commands the command rules deny (redis.call('KEYS',
// '*')): the proxy only sees EVAL. Where that matters, deny the commands in a
// Redis ACL too (e.g. -keys -flushall -flushdb), which Redis applies inside
// scripts.
//
// # Key-name rules
//
// [policy.names] applies to keys a command may create (the same
// classification) and to the declared keys of EVAL/EVALSHA/FCALL; reads,
// deletes and EXPIREs of existing keys are never refused, so legacy keys
// remain readable and can be cleaned up. Checks, in order: max_key_length
// (bytes), namespaces (the key must start with an allowed first segment and
// ':'), regex (must match the whole key), require_version (keys matching one
// of these globs need a "v<N>" segment: {module}:{scope}:v{N}).
//
// # Value-size rule
//
// [policy.values] (max_value_bytes, 100KB when the table is present without
// it) applies to commands flagged "write": any argument that is not a key and
// is longer than the limit is a violation. Treating every non-key argument
// of a write as a value is the simplest rule that covers SET, MSET, HSET,
// LPUSH, XADD, RESTORE, ... without per-command tables, and options are never
// that long. Scripts are not writes by Redis's flags, so EVAL bodies pass.
//
// # Scopes
//
// [[policy.scope]] entries give some users (AUTH names) and/or listeners their
// own rules; when both lists are set both must match. The first matching
// scope in document order applies, else the global rules. A scope's mode
// replaces the global mode. Its ttl, names and values sections, when present,
// replace the global ones wholesale (ttl = [] means no TTL rules); its
// commands lists are layered on top of the global lists (built-in denials,
// then global deny, global allow, scope deny, scope allow — later wins).
//
// # Messages
//
// Refusals are Redis error replies starting with "ERR redproxy policy: ",
// naming the rule and the fix, e.g.
//
//	ERR redproxy policy: key "foo" does not match naming rule "namespaces"; ...
//	ERR redproxy policy: key "session:1" needs a TTL (rule "session:*"); ...
//	ERR redproxy policy: value of 204800 bytes exceeds 102400 (rule "value_size"); ...
//
// Values never appear in messages or violations; keys are cut to 100 bytes.
package policy
