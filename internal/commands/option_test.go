package commands

import (
	"slices"
	"testing"
)

// TestEqualFoldStopsAtNUL: option words compare as Redis's strcasecmp
// does, up to the argument's first NUL (checked against redis-server
// 7.0.15: SORT ... STORE\x00, COPY ... DB\x00, GETEX ... PERSIST\x00, SET
// ... NX\x00zz, XADD ... MAXLEN ~\x00junk all act as the option).
func TestEqualFoldStopsAtNUL(t *testing.T) {
	for _, c := range []struct {
		w, b string
		want bool
	}{
		{"store", "STORE", true},
		{"store", "store", true},
		{"store", "StOrE\x00", true},
		{"store", "STORE\x00xyz", true},
		{"db", "DB\x00\x00", true},
		{"~", "~\x00junk", true},
		{"store", "STOR", false},
		{"store", "STOREX", false},
		{"store", "STO\x00RE", false},
		{"store", "\x00STORE", false},
		{"store", "", false},
		{"db", "DBX\x00", false},
	} {
		if got := EqualFold(c.w, []byte(c.b)); got != c.want {
			t.Errorf("EqualFold(%q, %q) = %v, want %v", c.w, c.b, got, c.want)
		}
	}
}

// TestKeysOptionWordUpToNUL: the keys Redis finds after an option word
// spelled with a NUL suffix (COMMAND GETKEYS on redis-server 7.0.15) are
// keys to the proxy too, so namespaces and the ACL see them.
func TestKeysOptionWordUpToNUL(t *testing.T) {
	tbl := Builtin()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"SORT", "L", "STORE\x00", "d"}, []string{"L", "d"}},
		{[]string{"XREAD", "STREAMS\x00x", "a", "0"}, []string{"a"}},
		{[]string{"GEORADIUS", "G", "1", "2", "3", "km", "STORE\x00", "d"}, []string{"G", "d"}},
		{[]string{"MIGRATE", "h", "1", "", "0", "1", "KEYS\x00", "a", "b"}, []string{"a", "b"}},
	} {
		args := make([][]byte, len(c.args))
		for i, a := range c.args {
			args[i] = []byte(a)
		}
		var got []string
		for _, i := range tbl.Lookup(args).Keys(args, nil) {
			got = append(got, string(args[i]))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Keys(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}
