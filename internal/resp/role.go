package resp

import "bytes"

// ServerRole reads a server's role ("master", "slave" or "replica",
// "sentinel") and mode ("standalone", "cluster", "sentinel"; "" from ROLE)
// from its reply to ROLE (an array whose first element is the role) or to
// HELLO (a map, or in RESP2 a flat array of field names and values). ok is
// false for any other reply, an error among them. The one reading of it
// for Sentinel's candidate checks and for the handshake of a connection
// that must reach a primary.
func ServerRole(r []byte) (role, mode string, ok bool) {
	el, ok := fields(r)
	if !ok || len(el) == 0 {
		return "", "", false
	}
	first, _ := simpleText(el[0])
	switch first {
	case "master", "slave", "sentinel":
		return first, "", true // ROLE
	}
	for i := 0; i+1 < len(el); i += 2 { // HELLO
		k, _ := simpleText(el[i])
		v, _ := simpleText(el[i+1])
		switch k {
		case "role":
			role = v
		case "mode":
			mode = v
		}
	}
	return role, mode, role != ""
}

// HelloID returns the id field of a HELLO reply (RESP3 map or RESP2
// array: server, version, proto, id, ...), 0 for any other reply. Read by
// the same walk over the fields as ServerRole: a search for the key's
// bytes would take a value spelled like it for the key.
func HelloID(r []byte) int64 {
	el, ok := fields(r)
	if !ok {
		return 0
	}
	for i := 0; i+1 < len(el); i += 2 {
		if k, _ := simpleText(el[i]); k == "id" {
			id, _ := Integer(el[i+1])
			return id
		}
	}
	return 0
}

// HelloVersion returns the version field of a HELLO reply, "" for any
// other reply.
func HelloVersion(r []byte) string {
	el, ok := fields(r)
	if !ok {
		return ""
	}
	for i := 0; i+1 < len(el); i += 2 {
		if k, _ := simpleText(el[i]); k == "version" {
			v, _ := simpleText(el[i+1])
			return v
		}
	}
	return ""
}

// FunctionStatsRunning reports whether r, a reply to FUNCTION STATS (a
// map, or in RESP2 a flat array of field names and values), names a
// running script: its running_script field is not null.
func FunctionStatsRunning(r []byte) bool {
	el, ok := fields(r)
	if !ok {
		return false
	}
	for i := 0; i+1 < len(el); i += 2 {
		if k, _ := simpleText(el[i]); k == "running_script" {
			return !IsNull(el[i+1])
		}
	}
	return false
}

// fields splits an array or map reply into its framed elements (a map's
// keys and values alternating); at most 1024 of them.
func fields(r []byte) ([][]byte, bool) {
	nl := bytes.IndexByte(r, '\n')
	if nl < 2 || r[0] != '*' && r[0] != '%' {
		return nil, false
	}
	n, ok := parseInt(r[1 : nl-1])
	if !ok || n < 0 || n > 1024 {
		return nil, false
	}
	if r[0] == '%' {
		n *= 2
	}
	out, _, ok := scanElements(r, nl+1, int(n))
	return out, ok
}

// simpleText is a simple or bulk string reply's text.
func simpleText(r []byte) (string, bool) {
	switch {
	case len(r) >= 3 && r[0] == '+':
		return string(r[1 : len(r)-2]), true
	case len(r) >= 4 && r[0] == '$':
		if nl := bytes.IndexByte(r, '\n'); nl > 0 && nl+1 <= len(r)-2 {
			return string(r[nl+1 : len(r)-2]), true
		}
	}
	return "", false
}
