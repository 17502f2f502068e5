package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// member is one top-level member of a JSON object: its key (unescaped) and
// where its key token starts and its value starts and ends in the body.
type member struct {
	key            string
	k0, v0, v1, e1 int // e1: end of the member including a following comma, or v1
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index after the string literal starting at b[i]
// ('"'). b is valid JSON.
func skipString(b []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		i += j
		// Count the backslashes before the quote: odd means escaped.
		k := i - 1
		for k >= 0 && b[k] == '\\' {
			k--
		}
		i++
		if (i-2-k)%2 == 0 {
			return i
		}
	}
}

// skipValue returns the index after the value starting at b[i]. b is
// valid JSON.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// unquote returns the contents of the JSON string literal s.
func unquote(s []byte) (string, error) {
	if v, ok := plainString(s); ok {
		return v, nil
	}
	var v string
	err := json.Unmarshal(s, &v)
	return v, err
}

// plainString returns the contents of a JSON string literal without
// escapes or control characters (the common case) without running the
// JSON decoder. Invalid UTF-8 takes the decoder's path, which replaces it.
func plainString(s []byte) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	body := s[1 : len(s)-1]
	ascii := true
	for _, c := range body {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(body) {
		return "", false
	}
	return string(body), true
}

// objectMembers lists the top-level members of the JSON object b, which
// must be valid JSON. It rejects a non-object and duplicate keys.
func objectMembers(b []byte, what string) ([]member, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, BadRequest("%s must be a JSON object", what)
	}
	var ms []member
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return ms, nil
	}
	for i < len(b) {
		k0 := i
		k1 := skipString(b, i)
		key, err := unquote(b[k0:k1])
		if err != nil {
			return nil, BadRequest("%s: bad key: %v", what, err)
		}
		i = skipSpace(b, k1)
		i = skipSpace(b, i+1) // ':'
		v0 := i
		v1 := skipValue(b, i)
		i = skipSpace(b, v1)
		m := member{key: key, k0: k0, v0: v0, v1: v1, e1: v1}
		for _, o := range ms {
			if o.key == key {
				return nil, BadRequest("%s has the key %q twice", what, key).WithParam(key)
			}
		}
		if i < len(b) && b[i] == ',' {
			m.e1 = i + 1
			ms = append(ms, m)
			i = skipSpace(b, i+1)
			continue
		}
		ms = append(ms, m)
		break
	}
	return ms, nil
}

// find returns the member with key, or nil.
func find(ms []member, key string) *member {
	for i := range ms {
		if ms[i].key == key {
			return &ms[i]
		}
	}
	return nil
}

func isNull(v []byte) bool { return string(v) == "null" }

// parseInt reads an integer field as vLLM's pydantic models read one in
// their default (lax) mode: an integer literal, a number with no fractional
// part (1.0), a boolean (1 or 0), or a string holding an integer ("2",
// " 2 ", "+2", "2.00", "1_000"), within int64. The body goes to the engine
// as sent, so a value the engine takes must not be refused here.
func parseInt(key string, v []byte) (*int64, error) {
	if isNull(v) {
		return nil, nil
	}
	var n int64
	var ok bool
	switch {
	case len(v) == 0:
	case v[0] == '"':
		if s, err := unquote(v); err == nil {
			n, ok = laxInt(s)
		}
	case string(v) == "true":
		n, ok = 1, true
	case string(v) == "false":
		n, ok = 0, true
	default:
		n, ok = jsonInt(string(v))
	}
	if !ok {
		return nil, BadRequest("%s must be an integer in the 64-bit range, got %s", key, clip(v)).WithParam(key)
	}
	return &n, nil
}

// jsonInt reads a JSON number with no fractional part within int64.
func jsonInt(s string) (int64, bool) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// laxInt reads a string as pydantic reads one for an integer: surrounding
// white space trimmed, an optional sign, decimal digits with single
// underscores between them, and an optional fraction of zeros only.
func laxInt(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '.'); i >= 0 {
		if strings.Trim(s[i+1:], "0") != "" {
			return 0, false
		}
		s = s[:i]
	}
	digits := strings.TrimLeft(s, "+-")
	if len(s)-len(digits) > 1 || digits == "" || digits[0] == '_' || digits[len(digits)-1] == '_' ||
		strings.Contains(digits, "__") {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
	return n, err == nil
}

// parseBool reads a boolean field as pydantic's lax mode does: true or
// false, 0 or 1 (also 0.0 and 1.0), or one of the strings "0", "1", "t",
// "f", "y", "n", "yes", "no", "on", "off", "true", "false" in any case.
// null is false.
func parseBool(key string, v []byte) (bool, error) {
	if b, err := parseStrictBool(key, v); err == nil {
		return b, nil
	}
	if len(v) > 0 && v[0] == '"' {
		if u, err := unquote(v); err == nil {
			switch strings.ToLower(u) {
			case "1", "t", "y", "yes", "on", "true":
				return true, nil
			case "0", "f", "n", "no", "off", "false":
				return false, nil
			}
		}
	} else if n, ok := jsonInt(string(v)); ok && (n == 0 || n == 1) {
		return n == 1, nil
	}
	return false, BadRequest("%s must be a boolean, got %s", key, clip(v)).WithParam(key)
}

// parseStrictBool reads a boolean that must be JSON's true or false (null
// is false): kv_transfer_params is a free dict to vLLM, whose connectors
// test its flags for truth, so "false" there would be true.
func parseStrictBool(key string, v []byte) (bool, error) {
	switch string(v) {
	case "true":
		return true, nil
	case "false", "null":
		return false, nil
	}
	return false, BadRequest("%s must be a boolean", key).WithParam(key)
}

// ParseOptBool reads the optional boolean field key as vLLM's pydantic
// models read one (true, 1, "yes", …); absent (empty) or null is nil.
func ParseOptBool(key string, v []byte) (*bool, error) {
	if len(v) == 0 {
		return nil, nil
	}
	return parseOptBool(key, v)
}

func parseOptBool(key string, v []byte) (*bool, error) {
	if isNull(v) {
		return nil, nil
	}
	b, err := parseBool(key, v)
	return &b, err
}

func parseString(key string, v []byte) (string, error) {
	if isNull(v) {
		return "", nil
	}
	if len(v) == 0 || v[0] != '"' {
		return "", BadRequest("%s must be a string", key).WithParam(key)
	}
	s, err := unquote(v)
	if err != nil {
		return "", BadRequest("%s: %v", key, err).WithParam(key)
	}
	return s, nil
}

// ParseTokenIDs reads a JSON array of token ids (integers in [0, 2^32)) as
// uint32, allocating only the result. what names the field in errors.
func ParseTokenIDs(v []byte, what string) ([]uint32, error) {
	if !valid(v) {
		return nil, BadRequest("%s must be a list of token ids", what).WithParam(what)
	}
	return tokenIDs(v, what, what)
}

// tokenIDs is ParseTokenIDs for input known to be valid JSON; param is the
// request field named in errors.
func tokenIDs(v []byte, what, param string) ([]uint32, error) {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return nil, BadRequest("%s must be a list of token ids", what).WithParam(param)
	}
	// A token id takes at least two bytes ("1,"): size the result once.
	ids := make([]uint32, 0, (len(v)-i)/2+1)
	i = skipSpace(v, i+1)
	if i < len(v) && v[i] == ']' {
		return ids, nil
	}
	for i < len(v) {
		j := skipValue(v, i)
		num := v[i:j]
		id, ok := tokenID(num)
		if !ok {
			return nil, BadRequest("%s[%d]: token ids must be integers in [0, 2^32), got %s", what, len(ids), clip(num)).WithParam(param)
		}
		ids = append(ids, id)
		i = skipSpace(v, j)
		if i < len(v) && v[i] == ',' {
			i = skipSpace(v, i+1)
			continue
		}
		break
	}
	return ids, nil
}

func tokenID(num []byte) (uint32, bool) {
	if len(num) == 0 || len(num) > 10 {
		return 0, false
	}
	var n uint64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n > math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// clip shortens a value quoted in an error message.
func clip(v []byte) string {
	if len(v) > 40 {
		return fmt.Sprintf("%s...", v[:40])
	}
	return string(v)
}

// maxDepth is encoding/json's nesting limit, kept so that valid and
// json.Valid agree.
const maxDepth = 10000

// valid reports whether b is one JSON value with optional white space
// around it, exactly as json.Valid, at several times its speed (strings,
// most of a request, are scanned by a tight loop).
func valid(b []byte) bool {
	var stackBuf [32]byte
	stack := stackBuf[:0] // '{' or '[' per open container
	i := skipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(stack) >= maxDepth {
				return false
			}
			end := byte('}')
			if c == '[' {
				end = ']'
			}
			if i = skipSpace(b, i+1); i < len(b) && b[i] == end {
				i++
				break
			}
			stack = append(stack, c)
			if c == '{' {
				var ok bool
				if i, ok = scanKey(b, i); !ok {
					return false
				}
			}
			continue
		case c == '"':
			var ok bool
			if i, ok = scanString(b, i); !ok {
				return false
			}
		case c == '-' || c >= '0' && c <= '9':
			var ok bool
			if i, ok = scanNumber(b, i); !ok {
				return false
			}
		case c == 't':
			if i = literal(b, i, "true"); i < 0 {
				return false
			}
		case c == 'f':
			if i = literal(b, i, "false"); i < 0 {
				return false
			}
		case c == 'n':
			if i = literal(b, i, "null"); i < 0 {
				return false
			}
		default:
			return false
		}
		// A value ended at i: close containers, or go on to the next one.
		for {
			i = skipSpace(b, i)
			if len(stack) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := stack[len(stack)-1]
			switch b[i] {
			case ',':
				i = skipSpace(b, i+1)
				if top == '{' {
					var ok bool
					if i, ok = scanKey(b, i); !ok {
						return false
					}
				}
			case '}', ']':
				if (b[i] == '}') != (top == '{') {
					return false
				}
				stack = stack[:len(stack)-1]
				i++
				continue
			default:
				return false
			}
			break
		}
	}
}

// scanKey reads `"key" :` at i and returns where the value starts.
func scanKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	i, ok := scanString(b, i)
	if !ok {
		return 0, false
	}
	if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
		return 0, false
	}
	return skipSpace(b, i+1), true
}

// scanString checks the string literal at b[i] and returns its end.
func scanString(b []byte, i int) (int, bool) {
	for i++; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return 0, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return 0, false
				}
				for _, h := range b[i+2 : i+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return 0, false
					}
				}
				i += 6
			default:
				return 0, false
			}
		case c < 0x20:
			return 0, false
		default:
			i++
		}
	}
	return 0, false
}

// scanNumber checks the number at b[i] and returns its end.
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(i int) (int, bool) {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i, i > start
	}
	if b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else {
		var ok bool
		if i, ok = digits(i); !ok {
			return 0, false
		}
	}
	if i < len(b) && b[i] == '.' {
		var ok bool
		if i, ok = digits(i + 1); !ok {
			return 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		var ok bool
		if i, ok = digits(i); !ok {
			return 0, false
		}
	}
	return i, true
}

// literal checks the literal lit at b[i] and returns its end, or -1.
func literal(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
