package commands

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrBadReply means the upstream's COMMAND reply did not have the documented
// shape; callers typically fall back to Builtin.
var ErrBadReply = errors.New("commands: malformed COMMAND reply")

// Load builds a table from the upstream's own COMMAND reply, so the proxy
// knows exactly the commands (including modules') that server has. Commands
// that come without key specs (servers before Redis 7) borrow them from the
// builtin table when it has a command of the same name, which keeps
// movable-key commands such as EVAL working.
func Load(ctx context.Context, c *redis.Client) (*Table, error) {
	reply, err := c.Do(ctx, "COMMAND").Result()
	if err != nil {
		return nil, fmt.Errorf("commands: COMMAND: %w", err)
	}
	cmds, err := Parse(reply)
	if err != nil {
		return nil, err
	}
	fillMissingSpecs(cmds, Builtin())
	return newTable(cmds), nil
}

// NewTable indexes commands parsed from a COMMAND reply (Parse), as Load
// does. It takes ownership of cmds.
func NewTable(cmds []*Command) *Table { return newTable(cmds) }

func fillMissingSpecs(cmds []*Command, from *Table) {
	for _, c := range cmds {
		if len(c.KeySpecs) == 0 {
			if b := from.Get(c.Name); b != nil {
				c.KeySpecs = b.KeySpecs
			}
		}
		for _, s := range c.Subcommands {
			if len(s.KeySpecs) == 0 {
				if b := from.Get(s.Name); b != nil {
					s.KeySpecs = b.KeySpecs
				}
			}
		}
	}
}

// Parse converts a COMMAND or COMMAND INFO reply as returned by go-redis's Do
// (RESP2 arrays or RESP3 maps and sets) into top-level commands with their
// subcommands attached. Nil entries (COMMAND INFO of an unknown name) are
// skipped. Unknown flags, categories and tips are ignored so that newer
// servers still load.
func Parse(reply any) ([]*Command, error) {
	list, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: top level is %T, want array", ErrBadReply, reply)
	}
	cmds := make([]*Command, 0, len(list))
	for _, v := range list {
		if v == nil {
			continue
		}
		c, err := parseCommand(v)
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, c)
	}
	return cmds, nil
}

// parseCommand reads one entry: name, arity, flags, first key, last key,
// step, ACL categories, tips, key specs, subcommands (the last four only from
// newer servers).
func parseCommand(v any) (*Command, error) {
	e, ok := v.([]any)
	if !ok || len(e) < 6 {
		return nil, fmt.Errorf("%w: command entry %T of length %d", ErrBadReply, v, lenOf(v))
	}
	name, ok := e[0].(string)
	if !ok {
		return nil, fmt.Errorf("%w: command name is %T", ErrBadReply, e[0])
	}
	c := &Command{Name: strings.ToLower(name)}
	var err error
	bad := func(what string, err error) error {
		return fmt.Errorf("%w: %s of %q: %v", ErrBadReply, what, c.Name, err)
	}
	if c.Arity, err = toInt(e[1]); err != nil {
		return nil, bad("arity", err)
	}
	if c.FirstKey, err = toInt(e[3]); err != nil {
		return nil, bad("first key", err)
	}
	if c.LastKey, err = toInt(e[4]); err != nil {
		return nil, bad("last key", err)
	}
	if c.KeyStep, err = toInt(e[5]); err != nil {
		return nil, bad("key step", err)
	}
	// Flags, categories and tips all land in Flags.
	for i := 2; i < len(e) && i <= 7; i++ {
		if i >= 3 && i <= 5 {
			continue
		}
		words, err := toStrings(e[i])
		if err != nil {
			return nil, bad("flags", err)
		}
		for _, w := range words {
			tip, _, _ := strings.Cut(w, ":") // "request_policy:all_shards"
			c.Flags |= flagByRedisName(tip)
		}
	}
	if len(e) > 8 && e[8] != nil {
		specs, ok := e[8].([]any)
		if !ok {
			return nil, bad("key specs", fmt.Errorf("got %T", e[8]))
		}
		for _, sv := range specs {
			s, err := parseKeySpec(sv)
			if err != nil {
				return nil, bad("key spec", err)
			}
			c.KeySpecs = append(c.KeySpecs, s)
		}
	}
	if len(e) > 9 && e[9] != nil {
		subs, ok := e[9].([]any)
		if !ok {
			return nil, bad("subcommands", fmt.Errorf("got %T", e[9]))
		}
		for _, sv := range subs {
			s, err := parseCommand(sv)
			if err != nil {
				return nil, err
			}
			_, key, found := strings.Cut(s.Name, "|")
			if !found {
				key = s.Name
			}
			if c.Subcommands == nil {
				c.Subcommands = make(map[string]*Command, len(subs))
			}
			c.Subcommands[key] = s
		}
	}
	return c, nil
}

func parseKeySpec(v any) (KeySpec, error) {
	var s KeySpec
	m, err := toMap(v)
	if err != nil {
		return s, err
	}
	flags, err := toStrings(m["flags"])
	if err != nil {
		return s, fmt.Errorf("flags: %v", err)
	}
	for _, f := range flags {
		s.Flags |= keySpecFlagByName(f)
	}

	typ, spec, err := typedSpec(m["begin_search"])
	if err != nil {
		return s, fmt.Errorf("begin_search: %v", err)
	}
	switch typ {
	case "index":
		s.Begin.Kind = BeginIndex
		s.Begin.Index, err = intField(spec, "index")
	case "keyword":
		s.Begin.Kind = BeginKeyword
		s.Begin.Keyword, _ = spec["keyword"].(string)
		if s.Begin.Keyword == "" {
			err = errors.New("keyword missing")
		}
		if err == nil {
			s.Begin.StartFrom, err = intField(spec, "startfrom")
		}
	default: // "unknown", or something newer we cannot interpret
		s.Begin.Kind = BeginUnknown
	}
	if err != nil {
		return s, fmt.Errorf("begin_search %s: %v", typ, err)
	}

	typ, spec, err = typedSpec(m["find_keys"])
	if err != nil {
		return s, fmt.Errorf("find_keys: %v", err)
	}
	f := &s.Find
	switch typ {
	case "range":
		f.Kind = FindRange
		err = intFields(spec, map[string]*int{"lastkey": &f.LastKey, "keystep": &f.KeyStep, "limit": &f.Limit})
	case "keynum":
		f.Kind = FindKeynum
		err = intFields(spec, map[string]*int{"keynumidx": &f.KeyNumIdx, "firstkey": &f.FirstKey, "keystep": &f.KeyStep})
	default:
		f.Kind = FindUnknown
	}
	if err != nil {
		return s, fmt.Errorf("find_keys %s: %v", typ, err)
	}
	return s, nil
}

// typedSpec reads a {type: ..., spec: {...}} pair.
func typedSpec(v any) (string, map[string]any, error) {
	m, err := toMap(v)
	if err != nil {
		return "", nil, err
	}
	typ, _ := m["type"].(string)
	spec := map[string]any{}
	if m["spec"] != nil {
		if spec, err = toMap(m["spec"]); err != nil {
			return "", nil, err
		}
	}
	return typ, spec, nil
}

func intField(m map[string]any, name string) (int, error) {
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("%s missing", name)
	}
	return toInt(v)
}

func intFields(m map[string]any, dst map[string]*int) error {
	for name, p := range dst {
		v, err := intField(m, name)
		if err != nil {
			return err
		}
		*p = v
	}
	return nil
}

// toMap accepts a RESP3 map or a RESP2 flat array of alternating keys and
// values.
func toMap(v any) (map[string]any, error) {
	switch t := v.(type) {
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, val := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("map key %T", k)
			}
			out[ks] = val
		}
		return out, nil
	case map[string]any:
		return t, nil
	case []any:
		if len(t)%2 != 0 {
			return nil, fmt.Errorf("odd-length pair array (%d)", len(t))
		}
		out := make(map[string]any, len(t)/2)
		for i := 0; i < len(t); i += 2 {
			ks, ok := t[i].(string)
			if !ok {
				return nil, fmt.Errorf("map key %T", t[i])
			}
			out[ks] = t[i+1]
		}
		return out, nil
	default:
		return nil, fmt.Errorf("got %T, want map", v)
	}
}

func toStrings(v any) ([]string, error) {
	switch t := v.(type) {
	case nil:
		return nil, nil
	case []any:
		out := make([]string, 0, len(t))
		for _, x := range t {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("element %T, want string", x)
			}
			out = append(out, s)
		}
		return out, nil
	case map[any]bool: // a RESP3 set decoded as a map, should a client do so
		out := make([]string, 0, len(t))
		for x := range t {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("element %T, want string", x)
			}
			out = append(out, s)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("got %T, want array", v)
	}
}

func toInt(v any) (int, error) {
	switch t := v.(type) {
	case int64:
		return int(t), nil
	case int:
		return t, nil
	case string:
		return strconv.Atoi(t)
	default:
		return 0, fmt.Errorf("got %T, want integer", v)
	}
}

func lenOf(v any) int {
	if a, ok := v.([]any); ok {
		return len(a)
	}
	return -1
}
