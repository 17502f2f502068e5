package openai

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// MessagesAssembler builds, from the events of a Messages API stream, the
// message the engine would have answered unstreamed, as the Anthropic
// SDKs accumulate a stream: message_start's message (with the type and
// role vLLM leaves out of it), its content blocks from their
// content_block_start and their deltas (text, thinking and a signature
// concatenated or set, a tool call's input_json_delta parts joined and
// parsed as its input, citations appended), message_delta's stop reason
// and stop sequence, and its usage over message_start's. An error event
// is the answer, with the status its type names.
type MessagesAssembler struct {
	size, events int
	start        []byte // message_start's message
	blocks       []*messageBlockParts
	at           map[int64]*messageBlockParts
	delta        []kept // message_delta's delta members, the last of each
	usage        []kept // message_delta's usage members, the last of each
	stopped      bool   // message_stop came
	errEv        []byte
}

// messageBlockParts is one content block being assembled.
type messageBlockParts struct {
	start                              []byte // content_block_start's block
	text, thinking, partial, signature []byte
	hasText, hasThinking, hasSignature bool
	citations                          [][]byte
}

// Event takes one event's data.
func (a *MessagesAssembler) Event(data []byte) error {
	data = trimSpace(data)
	if err := checkEvent(&a.size, data); err != nil {
		return err
	}
	a.events++
	var typ, message, index, block, delta, usage []byte
	ok := eachMember(data, func(key, v []byte) {
		switch string(key) {
		case `"type"`:
			typ = v
		case `"message"`:
			message = v
		case `"index"`:
			index = v
		case `"content_block"`:
			block = v
		case `"delta"`:
			delta = v
		case `"usage"`:
			usage = v
		}
	})
	if !ok {
		return ErrBadEvent
	}
	switch string(typ) {
	case `"message_start"`:
		if nonNull(message) == nil || message[0] != '{' {
			return errors.New("a message_start event without its message")
		}
		a.start = append([]byte(nil), message...)
	case `"content_block_start"`:
		b, err := a.block(index, true)
		if err != nil {
			return err
		}
		if len(block) == 0 || block[0] != '{' {
			return errors.New("a content_block_start event without its block")
		}
		b.start = append(b.start[:0], block...)
	case `"content_block_delta"`:
		b, err := a.block(index, false)
		if err != nil {
			return err
		}
		return b.add(delta)
	case `"message_delta"`:
		a.delta = keepMembers(a.delta, delta)
		a.usage = keepMembers(a.usage, usage)
	case `"message_stop"`:
		a.stopped = true
	case `"error"`:
		if a.errEv == nil {
			a.errEv = append([]byte(nil), data...)
		}
	}
	return nil // ping, content_block_stop and events of later versions
}

// block is the block of an event's index (made by its start).
func (a *MessagesAssembler) block(index []byte, start bool) (*messageBlockParts, error) {
	i, err := strconv.ParseInt(string(index), 10, 64)
	if err != nil || i < 0 {
		return nil, fmt.Errorf("a content block event with index %.20s", index)
	}
	b := a.at[i]
	switch {
	case b == nil && !start:
		return nil, fmt.Errorf("a delta of content block %d before its start", i)
	case b == nil && len(a.blocks) >= maxIndexed:
		return nil, fmt.Errorf("more than %d content blocks", maxIndexed)
	case b == nil:
		if a.at == nil {
			a.at = map[int64]*messageBlockParts{}
		}
		b = &messageBlockParts{}
		a.at[i] = b
		a.blocks = append(a.blocks, b)
	}
	return b, nil
}

// add takes one delta of the block.
func (b *messageBlockParts) add(delta []byte) error {
	var typ, text, thinking, partial, signature, citation []byte
	ok := eachMember(delta, func(key, v []byte) {
		switch string(key) {
		case `"type"`:
			typ = v
		case `"text"`:
			text = v
		case `"thinking"`:
			thinking = v
		case `"partial_json"`:
			partial = v
		case `"signature"`:
			signature = v
		case `"citation"`:
			citation = v
		}
	})
	if !ok {
		return errors.New("a content_block_delta event without its delta")
	}
	var err error
	switch string(typ) {
	case `"text_delta"`:
		b.text, err = appendUnquoted(b.text, text)
		b.hasText = true
	case `"thinking_delta"`:
		b.thinking, err = appendUnquoted(b.thinking, thinking)
		b.hasThinking = true
	case `"input_json_delta"`:
		b.partial, err = appendUnquoted(b.partial, partial)
	case `"signature_delta"`:
		b.signature, err = appendUnquoted(b.signature[:0], signature)
		b.hasSignature = true
	case `"citations_delta"`:
		if len(citation) == 0 {
			return errors.New("a citations_delta without its citation")
		}
		b.citations = append(b.citations, append([]byte(nil), citation...))
	default:
		return fmt.Errorf("a content block delta of type %.40s", typ)
	}
	return err
}

// appendUnquoted appends the JSON string s's contents to dst.
func appendUnquoted(dst, s []byte) ([]byte, error) {
	if p, ok := plainBytes(s); ok {
		return append(dst, p...), nil
	}
	u, err := unquote(s)
	if err != nil || len(s) == 0 || s[0] != '"' {
		return dst, fmt.Errorf("a delta whose text is %.20s, not a string", s)
	}
	return append(dst, u...), nil
}

// keepMembers sets, in ms, each member of the object obj (the last
// value of a key wins; new keys keep their order).
func keepMembers(ms []kept, obj []byte) []kept {
	eachMember(nonNull(obj), func(key, v []byte) {
		for i := range ms {
			if string(ms[i].key) == string(key) {
				ms[i].value = append([]byte(nil), v...)
				return
			}
		}
		ms = append(ms, kept{append([]byte(nil), key...), append([]byte(nil), v...)})
	})
	return ms
}

// Answer is the assembled message (200), or the error event (its type's
// status); an error when the stream brought no event, or ended before
// its message_stop.
func (a *MessagesAssembler) Answer() (int, []byte, error) {
	switch {
	case a.errEv != nil:
		var typ []byte
		eachMember(a.errEv, func(key, v []byte) {
			if string(key) == `"error"` {
				eachMember(v, func(key, v []byte) {
					if string(key) == `"type"` {
						typ = v
					}
				})
			}
		})
		s, _ := unquote(typ)
		return MessagesErrorStatus(s), a.errEv, nil
	case a.events == 0:
		return 0, nil, errors.New("the engine's stream had no event")
	case a.start == nil || !a.stopped:
		return 0, nil, errors.New("the engine's stream ended before its message_stop")
	}
	content, err := a.content()
	if err != nil {
		return 0, nil, err
	}
	set := []kept{{[]byte(`"content"`), content}}
	set = append(set, a.delta...)
	var usage []byte
	eachMember(a.start, func(key, v []byte) {
		if string(key) == `"usage"` {
			usage = v
		}
	})
	if len(a.usage) > 0 {
		set = append(set, kept{[]byte(`"usage"`), withMembers(nonNull(usage), a.usage)})
	}
	var has [2]bool // type, role
	eachMember(a.start, func(key, v []byte) {
		has[0] = has[0] || string(key) == `"type"`
		has[1] = has[1] || string(key) == `"role"`
	})
	var first []kept
	if !has[0] {
		first = append(first, kept{[]byte(`"type"`), []byte(`"message"`)})
	}
	if !has[1] {
		first = append(first, kept{[]byte(`"role"`), []byte(`"assistant"`)})
	}
	return http.StatusOK, withMembers(a.start, set, first...), nil
}

// content is the blocks, in the order of their starts.
func (a *MessagesAssembler) content() ([]byte, error) {
	out := []byte{'['}
	for i, b := range a.blocks {
		if i > 0 {
			out = append(out, ',')
		}
		var set []kept
		if b.hasText {
			set = append(set, kept{[]byte(`"text"`), appendJSONString(nil, append(memberString(b.start, `"text"`), b.text...))})
		}
		if b.hasThinking {
			set = append(set, kept{[]byte(`"thinking"`), appendJSONString(nil, append(memberString(b.start, `"thinking"`), b.thinking...))})
		}
		if b.hasSignature {
			set = append(set, kept{[]byte(`"signature"`), appendJSONString(nil, b.signature)})
		}
		if len(b.partial) > 0 {
			if !valid(b.partial) {
				return nil, fmt.Errorf("content block %d: its input_json_delta parts are not JSON", i)
			}
			set = append(set, kept{[]byte(`"input"`), b.partial})
		}
		if len(b.citations) > 0 {
			c := []byte{'['}
			eachElement(memberValue(b.start, `"citations"`), func(el []byte) {
				c = append(append(c, el...), ',')
			})
			for _, x := range b.citations {
				c = append(append(c, x...), ',')
			}
			c[len(c)-1] = ']'
			set = append(set, kept{[]byte(`"citations"`), c})
		}
		out = withMembersTo(out, b.start, set)
	}
	return append(out, ']'), nil
}

// memberValue is the value of obj's member key (quoted; nil: none).
func memberValue(obj []byte, key string) []byte {
	var out []byte
	eachMember(obj, func(k, v []byte) {
		if string(k) == key {
			out = v
		}
	})
	return out
}

// memberString is the contents of obj's string member key (nil: none or
// not a string).
func memberString(obj []byte, key string) []byte {
	v := memberValue(obj, key)
	if len(v) == 0 || v[0] != '"' {
		return nil
	}
	s, err := unquote(v)
	if err != nil {
		return nil
	}
	return []byte(s)
}

// withMembers is the object obj with set's members: each in place of
// obj's member of its key, or after obj's members; first comes after
// obj's first member (its id).
func withMembers(obj []byte, set []kept, first ...kept) []byte {
	return withMembersTo(nil, obj, set, first...)
}

// withMembersTo appends withMembers to dst.
func withMembersTo(dst, obj []byte, set []kept, first ...kept) []byte {
	dst = append(dst, '{')
	done := make([]bool, len(set))
	n := 0
	eachMember(obj, func(key, v []byte) {
		for i := range set {
			if string(set[i].key) == string(key) {
				v, done[i] = set[i].value, true
				break
			}
		}
		dst = appendMember(dst, key, v)
		if n++; n == 1 {
			for _, f := range first {
				dst = appendMember(dst, f.key, f.value)
			}
		}
	})
	if n == 0 {
		for _, f := range first {
			dst = appendMember(dst, f.key, f.value)
		}
	}
	for i := range set {
		if !done[i] {
			dst = appendMember(dst, set[i].key, set[i].value)
		}
	}
	return append(dst, '}')
}
