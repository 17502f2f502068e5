package openai

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// StreamChunk is what kvgate reads of one event of a streamed completion
// or chat completion (its data line's JSON): the first choice's text, and
// whether anything else came that a continuation could not carry on.
type StreamChunk struct {
	// ID is the id's JSON string, quotes included (nil: none); it aliases
	// the parsed data (IDString decodes it).
	ID []byte
	// Text is the first choice's text (completions) or delta content
	// (chat); it may alias the parsed data.
	Text []byte
	// Other: the event brings more than text: reasoning, tool calls, or a
	// choice other than the first.
	Other bool
	// Finished: the first choice has a finish reason.
	Finished bool
	// Role: the first choice's delta names a role (chat's first event).
	Role bool
	// Usage and Error are the usage event's and an error event's values
	// (nil when absent or null); they alias the parsed data.
	Usage, Error []byte
	// Choices is how many elements choices has (0 in the final usage
	// event).
	Choices int
	// usageAt is the byte range of the usage member, key to value, in
	// the parsed data ([0, 0]: none).
	usageAt [2]int
}

var errNotObject = errors.New("not a JSON object")

// ParseStreamChunk parses an event's data (after "data:"). It reads the
// JSON with the request parser's scanner, without allocating for an
// event of plain text: a stream has an event a token, and a tap reads
// every one (BenchmarkStreamTap). Keys are matched as written (engines
// write them without escapes).
func ParseStreamChunk(data []byte) (StreamChunk, error) {
	var c StreamChunk
	if !valid(data) {
		return c, errors.New("invalid JSON")
	}
	ok := eachMember(data, func(key, v []byte) {
		switch string(key) {
		case `"id"`:
			c.ID = v
		case `"usage"`:
			c.Usage = nonNull(v)
			// key and v are reslices of data: their offsets are
			// what data's capacity has beyond theirs.
			c.usageAt = [2]int{cap(data) - cap(key), cap(data) - cap(v) + len(v)}
		case `"error"`:
			c.Error = nonNull(v)
		case `"object"`:
			if string(v) == `"error"` && c.Error == nil {
				c.Error = data // vLLM's older error shape: the event is the error
			}
		case `"choices"`:
			eachElement(v, func(el []byte) {
				c.Choices++
				c.choice(el)
			})
		}
	})
	if !ok {
		return c, errNotObject
	}
	return c, nil
}

// AppendWithoutUsage appends data, the event c was parsed from, to dst
// without its usage member: an event as an engine writes it for a client
// that did not ask for the usage in every event (a tap rewriting every
// event allocates nothing).
func (c *StreamChunk) AppendWithoutUsage(dst, data []byte) []byte {
	from, to := c.usageAt[0], c.usageAt[1]
	if to == 0 || to > len(data) || from >= to {
		return append(dst, data...)
	}
	// The member goes with the comma that joined it to its neighbour:
	// the one before it, or when it came first, the one after it.
	if i := skipSpaceBack(data, from); i > 0 && data[i-1] == ',' {
		from = i - 1
	} else if j := skipSpace(data, to); j < len(data) && data[j] == ',' {
		to = skipSpace(data, j+1)
	}
	return append(append(dst, data[:from]...), data[to:]...)
}

// skipSpaceBack is the index just past the last non-space byte of b
// before i.
func skipSpaceBack(b []byte, i int) int {
	for i > 0 && (b[i-1] == ' ' || b[i-1] == '\t' || b[i-1] == '\n' || b[i-1] == '\r') {
		i--
	}
	return i
}

// UsageCompletion is the completion_tokens of a usage object (false:
// absent, or not an integer in [0, 2^31)).
func UsageCompletion(usage []byte) (int, bool) {
	n, ok := -1, false
	eachMember(usage, func(key, v []byte) {
		if string(key) != `"completion_tokens"` {
			return
		}
		if x, err := strconv.ParseInt(string(v), 10, 32); err == nil && x >= 0 {
			n, ok = int(x), true
		}
	})
	return n, ok
}

// IDString is the event's id ("" when it has none, or not a string).
func (c *StreamChunk) IDString() string {
	s, _ := parseString("id", c.ID)
	return s
}

// choice reads one element of choices.
func (c *StreamChunk) choice(el []byte) {
	first := true
	var text, delta []byte
	finished := false
	ok := eachMember(el, func(key, v []byte) {
		switch string(key) {
		case `"index"`:
			first = string(v) == "0"
		case `"text"`:
			text = v
		case `"finish_reason"`:
			finished = nonNull(v) != nil
		case `"delta"`:
			delta = v
		}
	})
	if !ok || !first {
		c.Other = true
		return
	}
	c.Finished = c.Finished || finished
	c.addText(text)
	if delta != nil && !isNull(delta) && !eachMember(delta, c.delta) {
		c.Other = true
	}
}

// delta reads a member of a chat choice's delta.
func (c *StreamChunk) delta(key, v []byte) {
	switch string(key) {
	case `"role"`:
		c.Role = nonNull(v) != nil
	case `"content"`:
		c.addText(v)
	case `"reasoning_content"`, `"reasoning"`:
		if len(v) > 2 && v[0] == '"' {
			c.Other = true // a non-empty string
		}
	case `"tool_calls"`:
		eachElement(v, func([]byte) { c.Other = true })
	}
}

// addText appends the JSON string v (nil, null or not a string: nothing).
func (c *StreamChunk) addText(v []byte) {
	if len(v) < 2 || v[0] != '"' {
		return
	}
	t, plain := v[1:len(v)-1], true
	for _, b := range t {
		if b == '\\' || b < 0x20 {
			plain = false
			break
		}
	}
	if !plain || !utf8.Valid(t) {
		s, err := unquote(v)
		if err != nil {
			return
		}
		t = []byte(s)
	}
	if c.Text == nil {
		c.Text = t
		return
	}
	c.Text = append(append([]byte(nil), c.Text...), t...)
}

// eachMember calls f with each member of the JSON object b (valid JSON;
// other bytes end it somewhere, never out of bounds), its key as
// written, quotes included; false if b is not an object.
func eachMember(b []byte, f func(key, v []byte)) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		k1 := skipString(b, i)
		key := b[i:k1]
		v0 := skipSpace(b, skipSpace(b, k1)+1) // past ':'
		if v0 >= len(b) {
			return true // not JSON: cut short
		}
		v1 := skipValue(b, v0)
		f(key, b[v0:v1])
		i = skipSpace(b, v1)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return true
}

// Members calls f with each top-level member of the JSON object obj
// (valid JSON; other bytes end it somewhere, never out of bounds), in
// order, its key unquoted (a key that is not a JSON string is skipped),
// its value as written: a caller decodes only the members it needs.
func Members(obj []byte, f func(key string, v []byte)) {
	eachMember(obj, func(k, v []byte) {
		if key, err := unquote(k); err == nil {
			f(key, v)
		}
	})
}

// nonNull is v, or nil when v is null.
func nonNull(v []byte) []byte {
	if isNull(v) {
		return nil
	}
	return v
}

// eachElement calls f with each element of the JSON array v (valid JSON).
func eachElement(v []byte, f func(el []byte)) {
	if len(v) == 0 || v[0] != '[' {
		return
	}
	i := skipSpace(v, 1)
	for i < len(v) && v[i] != ']' {
		j := skipValue(v, i)
		f(v[i:j])
		i = skipSpace(v, j)
		if i < len(v) && v[i] == ',' {
			i = skipSpace(v, i+1)
		}
	}
}
