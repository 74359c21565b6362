package resp

// splitInline splits an inline request line into arguments with the quoting
// rules of Redis's inline protocol: "double quotes" understand \n \r \t \b \a
// \\ \" and \xHH; 'single quotes' understand only \'; a closing quote must be
// followed by a space or the end of the line. It reports false for
// unbalanced quotes. Each returned word is freshly allocated: inline requests
// are rare (humans typing), so clarity wins over avoiding copies here.
func splitInline(line []byte) ([][]byte, bool) {
	var words [][]byte
	i := 0
	for {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		if i == len(line) {
			return words, true
		}
		var cur []byte
		inDQ, inSQ := false, false
		for done := false; !done; {
			if inDQ {
				switch {
				case i >= len(line):
					return nil, false
				case line[i] == '\\' && i+3 < len(line) && line[i+1] == 'x' && isHex(line[i+2]) && isHex(line[i+3]):
					cur = append(cur, unhex(line[i+2])<<4|unhex(line[i+3]))
					i += 3
				case line[i] == '\\' && i+1 < len(line):
					i++
					switch c := line[i]; c {
					case 'n':
						cur = append(cur, '\n')
					case 'r':
						cur = append(cur, '\r')
					case 't':
						cur = append(cur, '\t')
					case 'b':
						cur = append(cur, '\b')
					case 'a':
						cur = append(cur, '\a')
					default:
						cur = append(cur, c)
					}
				case line[i] == '"':
					if i+1 < len(line) && !isSpace(line[i+1]) {
						return nil, false
					}
					done = true
				default:
					cur = append(cur, line[i])
				}
			} else if inSQ {
				switch {
				case i >= len(line):
					return nil, false
				case line[i] == '\\' && i+1 < len(line) && line[i+1] == '\'':
					i++
					cur = append(cur, '\'')
				case line[i] == '\'':
					if i+1 < len(line) && !isSpace(line[i+1]) {
						return nil, false
					}
					done = true
				default:
					cur = append(cur, line[i])
				}
			} else {
				switch {
				case i >= len(line) || endsWord(line[i]):
					done = true
				case line[i] == '"':
					inDQ = true
				case line[i] == '\'':
					inSQ = true
				default:
					cur = append(cur, line[i])
				}
			}
			if i < len(line) {
				i++
			}
		}
		if cur == nil {
			cur = []byte{}
		}
		words = append(words, cur)
	}
}

// endsWord reports whether c ends an unquoted word. Redis's sdssplitargs
// ends one on these four only, so "\v" and "\f" are part of a word,
// although they count as space between words and after a closing quote
// (isSpace).
func endsWord(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f'
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
