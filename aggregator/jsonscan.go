package aggregator

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// fieldTrie is the set of dotted paths a plan reads from record values,
// as a trie over path elements; leaf lists the paths (by index) that end
// at a node.
type fieldTrie struct {
	next map[string]*fieldTrie
	leaf []int
	// below lists the paths ending at or under this node: a repeated key
	// replaces what an earlier occurrence found under it.
	below []int
}

func (t *fieldTrie) add(path []string, idx int) {
	n := t
	n.below = append(n.below, idx)
	for _, p := range path {
		if n.next == nil {
			n.next = map[string]*fieldTrie{}
		}
		c := n.next[p]
		if c == nil {
			c = &fieldTrie{}
			n.next[p] = c
		}
		n = c
		n.below = append(n.below, idx)
	}
	n.leaf = append(n.leaf, idx)
}

// jsonKind is the type of a found JSON value.
type jsonKind uint8

const (
	jsonMissing jsonKind = iota
	jsonNull
	jsonString
	jsonNumber
	jsonOther // true, false, an object or an array
)

// span is one found value: its kind and its raw bytes in the record.
type span struct {
	kind jsonKind
	raw  []byte
}

// scanObject walks value, which must be one JSON object (RFC 8259; the
// same documents encoding/json accepts), and records in found[i] the
// value at each path of t (the last one wins when a key repeats, as with
// encoding/json). It allocates nothing for keys without escapes and
// reports false for anything that is not a valid JSON object.
func scanObject(value []byte, t *fieldTrie, found []span) bool {
	s := jscan{b: value}
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return false
	}
	if !s.object(t, found) {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

type jscan struct {
	b []byte
	i int
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// object scans {...} at s.i; t (nil: nothing wanted below) says what to
// record.
func (s *jscan) object(t *fieldTrie, found []span) bool {
	s.i++ // '{'
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	for {
		s.ws()
		start := s.i
		raw, ok := s.str()
		if !ok {
			return false
		}
		quoted := s.b[start:s.i]
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		var child *fieldTrie
		if t != nil && t.next != nil {
			if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
				child = t.next[string(raw)]
			} else if k, ok := unquote(quoted); ok {
				child = t.next[k]
			}
		}
		if child != nil {
			for _, idx := range child.below {
				found[idx] = span{}
			}
		}
		vs := s.i
		kind, ok := s.value(child, found)
		if !ok {
			return false
		}
		if child != nil {
			for _, idx := range child.leaf {
				found[idx] = span{kind: kind, raw: s.b[vs:s.i]}
			}
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// value scans one JSON value; objects are walked with t.
func (s *jscan) value(t *fieldTrie, found []span) (jsonKind, bool) {
	if s.i >= len(s.b) {
		return 0, false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return jsonOther, s.object(t, found)
	case c == '[':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return jsonOther, true
		}
		for {
			s.ws()
			if _, ok := s.value(nil, found); !ok {
				return 0, false
			}
			s.ws()
			if s.i >= len(s.b) {
				return 0, false
			}
			if s.b[s.i] == ']' {
				s.i++
				return jsonOther, true
			}
			if s.b[s.i] != ',' {
				return 0, false
			}
			s.i++
		}
	case c == '"':
		_, ok := s.str()
		return jsonString, ok
	case c == '-' || (c >= '0' && c <= '9'):
		return jsonNumber, s.number()
	case c == 't':
		return jsonOther, s.lit("true")
	case c == 'f':
		return jsonOther, s.lit("false")
	case c == 'n':
		return jsonNull, s.lit("null")
	}
	return 0, false
}

func (s *jscan) lit(l string) bool {
	if len(s.b)-s.i < len(l) || string(s.b[s.i:s.i+len(l)]) != l {
		return false
	}
	s.i += len(l)
	return true
}

// str scans a string and returns its raw content between the quotes.
func (s *jscan) str() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			return raw, true
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return nil, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return nil, false
					}
				}
				s.i += 6
			default:
				return nil, false
			}
		case c < 0x20:
			return nil, false
		default:
			s.i++
		}
	}
	return nil, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number scans a number by the JSON grammar.
func (s *jscan) number() bool {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	s.i = i
	return true
}

// unquote decodes a quoted JSON string (quotes included) as encoding/json
// does: escapes resolved, invalid UTF-8 and lone surrogates replaced by
// U+FFFD.
func unquote(q []byte) (string, bool) {
	raw := q[1 : len(q)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw), true
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			r, n := utf8.DecodeRune(raw[i:])
			out = utf8.AppendRune(out, r) // RuneError for invalid bytes
			i += n
			continue
		}
		switch raw[i+1] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(raw[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, hex4(raw[i+2:i+6])); r2 != utf8.RuneError {
						out = utf8.AppendRune(out, r2)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
			continue
		default: // '"', '\\', '/'
			out = append(out, raw[i+1])
		}
		i += 2
	}
	return string(out), true
}

func hex4(b []byte) rune {
	n, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(n)
}

// text is a found value as a grouping key or distinct value: strings
// unquoted, numbers by their literal, anything else by its compact JSON
// text.
func (v span) text() string {
	switch v.kind {
	case jsonString:
		s, _ := unquote(v.raw)
		return s
	case jsonNumber:
		return string(v.raw)
	default:
		var b bytes.Buffer
		if json.Compact(&b, v.raw) != nil {
			return string(v.raw)
		}
		return b.String()
	}
}

// float is a found number's value; false for non-numbers and numbers
// beyond float64.
func (v span) float() (float64, bool) {
	if v.kind != jsonNumber {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v.raw), 64)
	return f, err == nil
}
