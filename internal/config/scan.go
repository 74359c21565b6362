package config

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
)

// lineIndex maps dotted keys to the line that sets them, so errors found
// after decoding (validation) can still point into the file.
type lineIndex map[string]int

// indexed is key, as the decoder names it ("users.enabled"), in the form
// validation errors use ("users[1].enabled"): the key of line that reads
// as key once its array indexes are dropped. key itself if none does.
// (Found by review: a decoding error in the second [[users]] named no
// index, while a validation error there did.)
func (idx lineIndex) indexed(key string, line int) string {
	for k, l := range idx {
		if l == line && strings.Contains(k, "[") && withoutIndexes(k) == key {
			return k
		}
	}
	return key
}

// withoutIndexes drops every "[n]" of key.
func withoutIndexes(key string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(key, '[')
		if i < 0 {
			b.WriteString(key)
			return b.String()
		}
		b.WriteString(key[:i])
		j := strings.IndexByte(key[i:], ']')
		if j < 0 {
			b.WriteString(key[i:])
			return b.String()
		}
		key = key[i+j+1:]
	}
}

// find returns the line of key, or of its nearest enclosing table (keys set
// inside an inline table are not indexed individually), or 0. An array
// element ("deny[3]") is found at the line of its array.
func (idx lineIndex) find(key string) int {
	for key != "" {
		if line, ok := idx[key]; ok {
			return line
		}
		if strings.HasSuffix(key, "]") {
			if i := strings.LastIndexByte(key, '['); i > 0 {
				key = key[:i]
				continue
			}
		}
		i := strings.LastIndexByte(key, '.')
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// indexedTable names a table header with the position of every array table
// in its path: the second [[policy.scope]] is "policy.scope[1]", and a
// [[policy.scope.ttl]] after it "policy.scope[1].ttl[0]". arrays counts the
// elements seen per indexed array path.
func indexedTable(parts []string, arrays map[string]int, isArray bool) string {
	path := ""
	for i, part := range parts {
		if path != "" {
			path += "."
		}
		path += part
		if i == len(parts)-1 && isArray {
			n := arrays[path]
			arrays[path] = n + 1
			return path + "[" + strconv.Itoa(n) + "]"
		}
		if n, ok := arrays[path]; ok {
			path += "[" + strconv.Itoa(n-1) + "]"
		}
	}
	return path
}

// valueRule says which TOML value kinds a field of a units type accepts.
type valueRule struct {
	kinds []unstable.Kind
	hint  string
}

var unitRules = map[reflect.Type]valueRule{
	reflect.TypeFor[units.Duration](): {[]unstable.Kind{unstable.String},
		`write it as a string with a unit (e.g. "500ms", "2s")`},
	reflect.TypeFor[units.ByteSize](): {[]unstable.Kind{unstable.String, unstable.Integer},
		`use a whole number of bytes or a string with a unit (e.g. 65536, "64KB", "512MB", "1GiB")`},
	reflect.TypeFor[policy.Duration](): {[]unstable.Kind{unstable.String},
		`write it as a string with a unit (e.g. "90s", "15m", "24h", "7d")`},
}

// unitKeys maps dotted keys to the rule for their field, found by reflection
// so sections added by other packages are covered automatically.
var unitKeys = func() map[string]valueRule {
	keys := map[string]valueRule{}
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" {
				continue // untagged fields are not part of the documented schema
			}
			ft := f.Type
			if rule, ok := unitRules[ft]; ok {
				keys[prefix+name] = rule
				continue
			}
			// Elements of arrays of tables ([[policy.ttl]]) and optional
			// tables (pointers) are indexed without a position, as scan
			// names their keys.
			if ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				walk(ft, prefix+name+".")
			}
		}
	}
	walk(reflect.TypeFor[Config](), "")
	return keys
}()

// scan walks the document once before decoding. It indexes key lines and
// rejects values of the wrong kind for units fields: go-toml hands a
// non-string value (e.g. `timeout = 5`) to UnmarshalText and returns its error
// without any position or key, so catching it here is the only way to tell the
// operator where it is. Syntax errors are left to the decoder,
// which reports them with positions.
func scan(data []byte) (lineIndex, inlineKeys, []*Error) {
	idx := lineIndex{}
	inline := inlineKeys{}
	var errs []*Error
	var p unstable.Parser
	p.Reset(data)
	pos := positions{data: data}
	var table []string
	// Array tables ([[policy.ttl]]) are also indexed by position, as
	// "policy.ttl[2].max", the form validation errors name them in.
	arrays := map[string]int{}
	var itable string
	for p.NextExpression() {
		expr := p.Expression()
		var parts []string
		line := 0
		for it := expr.Key(); it.Next(); {
			n := it.Node()
			if line == 0 {
				// Not p.Shape: it counts lines from the start of the
				// file for every key, which made a file of 16,000
				// [[policy.ttl]] take 74 s to check (found by a probe).
				line, _ = pos.at(n.Raw.Offset)
			}
			parts = append(parts, string(n.Data))
		}
		var ikey string
		switch expr.Kind {
		case unstable.Table, unstable.ArrayTable:
			itable = indexedTable(parts, arrays, expr.Kind == unstable.ArrayTable)
			ikey = itable
			table = parts
		case unstable.KeyValue:
			ikey = strings.Join(parts, ".")
			if itable != "" {
				ikey = itable + "." + ikey
			}
			parts = append(append([]string(nil), table...), parts...)
		default:
			continue
		}
		key := strings.Join(parts, ".")
		if _, seen := idx[key]; !seen {
			idx[key] = line
		}
		if _, seen := idx[ikey]; !seen && ikey != key {
			idx[ikey] = line
		}
		if expr.Kind == unstable.KeyValue {
			errs = inline.walk(expr.Value(), ikey, &pos, errs)
		}
		if rule, ok := unitKeys[key]; ok && expr.Kind == unstable.KeyValue {
			if v := expr.Value(); !slices.Contains(rule.kinds, v.Kind) {
				errs = append(errs, &Error{Line: line, Key: ikey,
					Msg: fmt.Sprintf("invalid value %s: %s", v.Data, rule.hint)})
			}
		}
	}
	return idx, inline, errs
}

// positions turns byte offsets of the document, asked for mostly in
// increasing order, into lines and columns as the TOML decoder counts
// them (both 1-based, the column in bytes), in one pass over the file.
type positions struct {
	data        []byte
	off, starts int // how far lines are counted; where that line starts
	line        int // the line of off, less one
}

func (p *positions) at(offset uint32) (line, column int) {
	off := int(offset)
	if off < p.off {
		p.off, p.starts, p.line = 0, 0, 0 // behind: count again
	}
	for {
		nl := bytes.IndexByte(p.data[p.off:off], '\n')
		if nl < 0 {
			break
		}
		p.line++
		p.off += nl + 1
		p.starts = p.off
	}
	p.off = off
	return p.line + 1, off - p.starts + 1
}

// valueStart returns the offset of the value after a key ending at off:
// past blanks, "=" and blanks. ok is false if data does not read so.
func valueStart(data []byte, off uint32) (uint32, bool) {
	i := int(off)
	skip := func() {
		for i < len(data) && (data[i] == ' ' || data[i] == '\t') {
			i++
		}
	}
	skip()
	if i >= len(data) || data[i] != '=' {
		return 0, false
	}
	i++
	skip()
	return uint32(i), i < len(data)
}

// inlineKeys names the keys set inside inline tables (server = { listen =
// "...", ... }, hold = [{ pattern = "...", ... }]) by where each starts
// (line, column): the decoder names an unknown key there by its last part
// alone ("bogus" for users[0].bogus), or by its table's name without the
// array's ("stampede.bogus" for stampede.hold[1].bogus), found by a probe.
type inlineKeys map[[2]int]string

// walk records the keys of the inline tables in value, the value of key,
// and adds to errs the values of the wrong kind for units fields among
// them, as scan does for the others.
func (in inlineKeys) walk(value *unstable.Node, key string, pos *positions, errs []*Error) []*Error {
	switch value.Kind {
	case unstable.InlineTable:
		for it := value.Children(); it.Next(); {
			kv := it.Node()
			if kv.Kind != unstable.KeyValue {
				continue
			}
			name := key
			var at [2]int
			var keyEnd uint32
			for k := kv.Key(); k.Next(); {
				n := k.Node()
				if at[0] == 0 {
					at[0], at[1] = pos.at(n.Raw.Offset)
				}
				keyEnd = n.Raw.Offset + n.Raw.Length
				name += "." + string(n.Data)
			}
			in[at] = name
			v := kv.Value()
			// A value of the wrong type is reported where it starts; an
			// array, which has no position in the parser, at its "[",
			// found after the key's "=".
			start, known := v.Raw.Offset, v.Raw.Length > 0
			if !known && v.Kind == unstable.Array {
				start, known = valueStart(pos.data, keyEnd)
			}
			if known {
				vl, vc := pos.at(start)
				in[[2]int{vl, vc}] = name
			}
			if rule, ok := unitKeys[withoutIndexes(name)]; ok && !slices.Contains(rule.kinds, v.Kind) {
				errs = append(errs, &Error{Line: at[0], Key: name,
					Msg: fmt.Sprintf("invalid value %s: %s", v.Data, rule.hint)})
			}
			errs = in.walk(v, name, pos, errs)
		}
	case unstable.Array:
		i := 0
		for it := value.Children(); it.Next(); i++ {
			elem := it.Node()
			if elem.Kind != unstable.InlineTable && elem.Kind != unstable.Array && elem.Raw.Length > 0 {
				// A scalar of the wrong type is reported where it starts,
				// named by its array, as outside inline tables
				// (policy.commands.deny). Arrays have no position of their
				// own in the parser (found by review).
				l, c := pos.at(elem.Raw.Offset)
				in[[2]int{l, c}] = key
				continue
			}
			errs = in.walk(elem, key+"["+strconv.Itoa(i)+"]", pos, errs)
		}
	}
	return errs
}
