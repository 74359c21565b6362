package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/redproxy/redproxy/internal/config/units"
)

// lineIndex maps dotted keys to the line that sets them, so errors found
// after decoding (validation) can still point into the file.
type lineIndex map[string]int

// find returns the line of key, or of its nearest enclosing table (keys set
// inside an inline table are not indexed individually), or 0.
func (idx lineIndex) find(key string) int {
	for key != "" {
		if line, ok := idx[key]; ok {
			return line
		}
		i := strings.LastIndexByte(key, '.')
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
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
			if rule, ok := unitRules[f.Type]; ok {
				keys[prefix+name] = rule
			} else if f.Type.Kind() == reflect.Struct {
				walk(f.Type, prefix+name+".")
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
func scan(data []byte) (lineIndex, []*Error) {
	idx := lineIndex{}
	var errs []*Error
	var p unstable.Parser
	p.Reset(data)
	var table []string
	for p.NextExpression() {
		expr := p.Expression()
		var parts []string
		line := 0
		for it := expr.Key(); it.Next(); {
			n := it.Node()
			if line == 0 {
				line = p.Shape(n.Raw).Start.Line
			}
			parts = append(parts, string(n.Data))
		}
		switch expr.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = parts
		case unstable.KeyValue:
			parts = append(append([]string(nil), table...), parts...)
		default:
			continue
		}
		key := strings.Join(parts, ".")
		if _, seen := idx[key]; !seen {
			idx[key] = line
		}
		if rule, ok := unitKeys[key]; ok && expr.Kind == unstable.KeyValue {
			if v := expr.Value(); !slices.Contains(rule.kinds, v.Kind) {
				errs = append(errs, &Error{Line: line, Key: key,
					Msg: fmt.Sprintf("invalid value %s: %s", v.Data, rule.hint)})
			}
		}
	}
	return idx, errs
}
