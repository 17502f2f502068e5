package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"
)

// MaxAssembled bounds the event data an Assembler reads for one answer
// (128 MiB: a context window's tokens with vLLM's most top logprobs
// each); a longer stream is not assembled.
const MaxAssembled = 128 << 20

// ErrBadEvent: an event of the engine's stream is not a JSON object (the
// engine's fault: another engine may answer the request).
var ErrBadEvent = errors.New("an event that is not a JSON object")

// ErrAssembledTooLarge: the stream brought more than MaxAssembled bytes.
var ErrAssembledTooLarge = fmt.Errorf("the answer's stream is longer than kvgate assembles (%d MiB)", MaxAssembled>>20)

// Assembler builds, from the events of a chat or completion stream, the
// answer the engine would have sent had the request not streamed, as
// vLLM's own non-streamed answer is built from the same outputs:
//
//   - the first event's top-level members, in order ("object" becoming
//     chat.completion or text_completion), with "choices" assembled and
//     "usage" the last event's that had one;
//   - a choice per index, in index order: a chat choice's deltas merged
//     into its "message" (strings concatenated: content, reasoning;
//     tool calls merged by their index, their arguments concatenated),
//     a completion choice's "text" concatenated, "logprobs" merged
//     (their arrays concatenated), every other member its last non-null
//     value (finish_reason, stop_reason);
//   - an error event is the answer, with the status its code names
//     ({"error":{...}}, or vLLM's older {"object":"error",...} as the
//     error of one).
//
// Which requests a stream answers whole is Request.WholeFromStream's.
type Assembler struct {
	chat bool
	// top is the first event's members, values as sent but choices and
	// usage (written from choices and usage).
	top     []kept
	choices indexed
	usage   []byte
	errEv   []byte
	events  int
	done    bool
	size    int
	// err: the answer cannot be assembled (too many choices).
	err error
}

// kept is one member of an object, its key as written (quotes included).
type kept struct{ key, value []byte }

// assembled is one choice of the answer.
type assembled struct {
	index int64
	m     merged
}

// NewAssembler assembles a chat completion stream (chat) or a completion
// stream.
func NewAssembler(chat bool) *Assembler { return &Assembler{chat: chat} }

// Event reads one event's data (after "data:"; "[DONE]" ends the
// stream). An event that is not a JSON object, or one past MaxAssembled,
// is an error: the answer cannot be assembled.
func (a *Assembler) Event(data []byte) error {
	data = trimSpace(data)
	if string(data) == "[DONE]" {
		a.done = true
		return nil
	}
	if err := checkEvent(&a.size, data); err != nil {
		return err
	}
	first := a.events == 0
	a.events++
	ok := eachMember(data, func(key, v []byte) {
		switch string(key) {
		case `"choices"`:
			eachElement(v, a.choice)
		case `"usage"`:
			if nonNull(v) != nil {
				a.usage = append(a.usage[:0], v...)
			}
		case `"error"`:
			if nonNull(v) != nil && a.errEv == nil {
				a.errEv = slices.Clone(data)
			}
		case `"object"`:
			if string(v) == `"error"` && a.errEv == nil {
				a.errEv = slices.Clone(data) // vLLM's older error shape (ErrorAnswer)
			}
		}
		if first {
			m := kept{key: slices.Clone(key)}
			if k := string(key); k != `"choices"` && k != `"usage"` && k != `"object"` {
				m.value = slices.Clone(v) // the others are written anew
			}
			a.top = append(a.top, m)
		}
	})
	if !ok {
		return ErrBadEvent
	}
	return a.err
}

// checkEvent adds an event's data to the bytes an assembler has read
// (size) and checks it: within MaxAssembled, and JSON.
func checkEvent(size *int, data []byte) error {
	if *size += len(data); *size > MaxAssembled {
		return ErrAssembledTooLarge
	}
	if !valid(data) {
		return ErrBadEvent
	}
	return nil
}

// choice merges one element of an event's choices.
func (a *Assembler) choice(el []byte) {
	if err := a.choices.merge(el, levelChoice); err != nil && a.err == nil {
		a.err = err
	}
}

// maxIndexed bounds the choices of an answer, and the tool calls of a
// choice (OpenAI's n is at most 128; vLLM's is bounded by its batch).
const maxIndexed = 1 << 16

// indexed is a list of objects merged by their "index" member, in the
// order their indices first came.
type indexed struct {
	list []*assembled
	at   map[int64]*assembled
}

// merge merges the object el, at level, into the one of its index.
func (x *indexed) merge(el []byte, level int) error {
	var index int64
	eachMember(el, func(key, v []byte) {
		if string(key) == `"index"` {
			index, _ = strconv.ParseInt(string(v), 10, 64)
		}
	})
	it := x.at[index]
	if it == nil {
		if len(x.list) >= maxIndexed {
			return fmt.Errorf("more than %d choices or tool calls", maxIndexed)
		}
		if x.at == nil {
			x.at = map[int64]*assembled{}
		}
		it = &assembled{index: index}
		x.list = append(x.list, it)
		x.at[index] = it
	}
	var err error
	eachMember(el, func(key, v []byte) {
		if e := it.m.add(key, v, level); e != nil && err == nil {
			err = e
		}
	})
	return err
}

// Answer is the assembled answer: its status and body. An error event
// is the answer (its code's status when in 400–599, else 500). It is an
// error when the stream brought no event, or ended before its end: no
// [DONE] and a choice without a finish reason.
func (a *Assembler) Answer() (int, []byte, error) {
	if a.errEv != nil {
		status, body := ErrorAnswer(a.errEv)
		return status, body, nil
	}
	if a.events == 0 {
		return 0, nil, errors.New("the engine's stream had no event")
	}
	if !a.done && !a.finished() {
		return 0, nil, errors.New("the engine's stream ended before its answer did")
	}
	slices.SortStableFunc(a.choices.list, func(x, y *assembled) int {
		switch {
		case x.index < y.index:
			return -1
		case x.index > y.index:
			return 1
		}
		return 0
	})
	object := `"text_completion"`
	if a.chat {
		object = `"chat.completion"`
	}
	out := []byte{'{'}
	var choices, usage bool // written
	for _, m := range a.top {
		v := m.value
		switch string(m.key) {
		case `"object"`:
			v = []byte(object)
		case `"choices"`:
			v, choices = a.appendChoices(nil), true
		case `"usage"`:
			v, usage = a.usageOrNull(), true
		}
		out = appendMember(out, m.key, v)
	}
	if !choices {
		out = appendMember(out, []byte(`"choices"`), a.appendChoices(nil))
	}
	if !usage && a.usage != nil {
		out = appendMember(out, []byte(`"usage"`), a.usage)
	}
	return http.StatusOK, append(out, '}'), nil
}

// finished reports whether every choice has a finish reason.
func (a *Assembler) finished() bool {
	if len(a.choices.list) == 0 {
		return false
	}
	for _, c := range a.choices.list {
		f := c.m.field([]byte(`"finish_reason"`))
		if f == nil || !f.set {
			return false
		}
	}
	return true
}

func (a *Assembler) usageOrNull() []byte {
	if a.usage == nil {
		return []byte("null")
	}
	return a.usage
}

// appendChoices appends the choices array: a chat choice's delta is its
// message.
func (a *Assembler) appendChoices(dst []byte) []byte {
	dst = append(dst, '[')
	for i, c := range a.choices.list {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = c.m.appendJSON(dst, func(key []byte) []byte {
			if a.chat && string(key) == `"delta"` {
				return []byte(`"message"`)
			}
			return key
		})
	}
	return append(dst, ']')
}

// ErrorAnswer is a chat or completion stream's error event (its data,
// which StreamChunk.Error found) as an error answer: the status its code
// names (else 500) and the body, {"error":{...}} (vLLM's older
// {"object":"error",...} as the error of one).
func ErrorAnswer(data []byte) (int, []byte) {
	data = trimSpace(data)
	body := data
	older := false
	eachMember(data, func(key, v []byte) {
		older = older || string(key) == `"object"` && string(v) == `"error"`
	})
	if older {
		body = append(append([]byte(`{"error":`), data...), '}')
	}
	return errorStatus(body), body
}

// errorStatus is the status an error event names (its error's code, or
// the code of an error nested in it, when in 400–599), else 500.
func errorStatus(data []byte) int {
	status := http.StatusInternalServerError
	var look func(obj []byte, depth int)
	look = func(obj []byte, depth int) {
		eachMember(obj, func(key, v []byte) {
			switch string(key) {
			case `"code"`:
				if c, err := strconv.Atoi(string(v)); err == nil && c >= 400 && c <= 599 {
					status = c
				}
			case `"error"`:
				if depth < 3 {
					look(v, depth+1)
				}
			}
		})
	}
	look(data, 0)
	return status
}

// The levels of a merged object: a choice (only "text" concatenates;
// its delta and logprobs merge deeply), or deep (a delta, logprobs, a
// tool call: strings concatenate but the names and kinds, which an
// engine sends once).
const (
	levelChoice = iota
	levelDeep
)

// merged is an object merged from its parts in successive events, its
// members in the order they first came.
type merged struct{ fields []*mergedField }

// mergedField is one member of a merged object.
type mergedField struct {
	key  []byte
	kind uint8
	// set: a non-null value came.
	set bool
	// last (kindLast) the last non-null value; text (kindString) the
	// strings so far, decoded; elems (kindArray) the elements so far,
	// comma-joined; obj (kindObject) the merged object; items
	// (kindIndexed) tool calls by their index.
	last  []byte
	text  []byte
	elems []byte
	obj   *merged
	items indexed
}

const (
	kindNull    = iota // only nulls so far
	kindLast           // the last non-null value wins
	kindString         // strings concatenate
	kindArray          // arrays concatenate
	kindObject         // objects merge
	kindIndexed        // arrays of objects merged by their "index" (tool calls)
)

func (m *merged) field(key []byte) *mergedField {
	for _, f := range m.fields {
		if string(f.key) == string(key) {
			return f
		}
	}
	return nil
}

// add merges the member key: v at level (an error: too many tool calls).
func (m *merged) add(key, v []byte, level int) error {
	f := m.field(key)
	if f == nil {
		f = &mergedField{key: slices.Clone(key)}
		m.fields = append(m.fields, f)
	}
	if nonNull(v) == nil || len(v) == 0 {
		return nil
	}
	if f.kind == kindNull {
		if f.kind = kindOf(key, v[0], level); f.kind == kindObject {
			f.obj = &merged{}
		}
	}
	f.set = true
	switch f.kind {
	case kindString:
		if v[0] == '"' {
			if t, ok := plainBytes(v); ok {
				f.text = append(f.text, t...)
				return nil
			}
			if s, err := unquote(v); err == nil {
				f.text = append(f.text, s...)
				return nil
			}
		}
	case kindArray:
		if v[0] == '[' {
			eachElement(v, func(el []byte) {
				if len(f.elems) > 0 {
					f.elems = append(f.elems, ',')
				}
				f.elems = append(f.elems, el...)
			})
			return nil
		}
	case kindObject:
		if v[0] == '{' {
			var err error
			eachMember(v, func(k, x []byte) {
				if e := f.obj.add(k, x, levelDeep); e != nil && err == nil {
					err = e
				}
			})
			return err
		}
	case kindIndexed:
		if v[0] == '[' {
			var err error
			eachElement(v, func(el []byte) {
				if e := f.items.merge(el, levelDeep); e != nil && err == nil {
					err = e
				}
			})
			return err
		}
	case kindLast:
		f.last = append(f.last[:0], v...)
		return nil
	}
	// A value of another type than the member's first: it wins.
	*f = mergedField{key: f.key, kind: kindLast, set: true, last: slices.Clone(v)}
	return nil
}

// kindOf is how the member key, whose first non-null value starts with
// c, merges at level.
func kindOf(key []byte, c byte, level int) uint8 {
	k := string(key)
	switch {
	case c == '"' && level == levelChoice && k == `"text"`:
		return kindString
	case c == '"' && level == levelDeep && k != `"role"` && k != `"id"` && k != `"type"` && k != `"name"`:
		return kindString
	case c == '[' && level == levelDeep && k == `"tool_calls"`:
		return kindIndexed
	case c == '[':
		return kindArray
	case c == '{' && (level == levelDeep || k == `"delta"` || k == `"logprobs"`):
		return kindObject
	}
	return kindLast
}

// appendJSON appends the merged object, its keys renamed by rename.
func (m *merged) appendJSON(dst []byte, rename func([]byte) []byte) []byte {
	dst = append(dst, '{')
	for i, f := range m.fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		key := f.key
		if rename != nil {
			key = rename(key)
		}
		dst = append(append(dst, key...), ':')
		dst = f.appendValue(dst)
	}
	return append(dst, '}')
}

func (f *mergedField) appendValue(dst []byte) []byte {
	if !f.set {
		return append(dst, "null"...)
	}
	switch f.kind {
	case kindString:
		return appendJSONString(dst, f.text)
	case kindArray:
		return append(append(append(dst, '['), f.elems...), ']')
	case kindObject:
		return f.obj.appendJSON(dst, nil)
	case kindIndexed:
		dst = append(dst, '[')
		for i, it := range f.items.list {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = it.m.appendJSON(dst, nil)
		}
		return append(dst, ']')
	}
	return append(dst, f.last...)
}

// appendMember appends "key":v to an object being written (after its
// '{' or a member).
func appendMember(dst, key, v []byte) []byte {
	if dst[len(dst)-1] != '{' {
		dst = append(dst, ',')
	}
	return append(append(append(dst, key...), ':'), v...)
}

// appendJSONString appends s (UTF-8; invalid bytes become U+FFFD, as
// encoding/json has them) as a JSON string, escaping only what JSON
// requires.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}

// plainBytes is the contents of the JSON string literal s when it has
// no escapes, no control characters and only valid UTF-8 (no copy).
func plainBytes(s []byte) ([]byte, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return nil, false
	}
	body := s[1 : len(s)-1]
	for _, c := range body {
		if c == '\\' || c == '"' || c < 0x20 {
			return nil, false
		}
	}
	return body, utf8.Valid(body)
}

// trimSpace trims JSON white space around b.
func trimSpace(b []byte) []byte {
	i := skipSpace(b, 0)
	j := len(b)
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

// ResponsesAssembler builds, from the events of a Responses API stream,
// the response the engine would have answered unstreamed: the response
// object its final event carries (response.completed, response.incomplete
// or response.failed), which vLLM and SGLang build as they build the
// unstreamed answer. An error event is the answer, with the status its
// code names.
type ResponsesAssembler struct {
	final  []byte
	errEv  []byte
	events int
	size   int
}

// Event reads one event's data.
func (a *ResponsesAssembler) Event(data []byte) error {
	data = trimSpace(data)
	if err := checkEvent(&a.size, data); err != nil {
		return err
	}
	a.events++
	var typ, response []byte
	ok := eachMember(data, func(key, v []byte) {
		switch string(key) {
		case `"type"`:
			typ = v
		case `"response"`:
			response = v
		}
	})
	if !ok {
		return ErrBadEvent
	}
	switch string(typ) {
	case `"response.completed"`, `"response.incomplete"`, `"response.failed"`:
		if nonNull(response) == nil || response[0] != '{' {
			return fmt.Errorf("a %s event without its response", typ)
		}
		a.final = slices.Clone(response)
	case `"error"`:
		if a.errEv == nil {
			a.errEv = slices.Clone(data)
		}
	}
	return nil
}

// Answer is the final event's response (200), or the error event (its
// code's status, else 500); an error when the stream ended without
// either.
func (a *ResponsesAssembler) Answer() (int, []byte, error) {
	switch {
	case a.final != nil:
		return http.StatusOK, a.final, nil
	case a.errEv != nil:
		body := responsesErrorBody(a.errEv)
		return errorStatus(body), body, nil
	case a.events == 0:
		return 0, nil, errors.New("the engine's stream had no event")
	}
	return 0, nil, errors.New("the engine's stream ended before its response did")
}

// responsesErrorBody is a Responses stream's error event as an error
// answer's body, in the shape clients read ({"error":{"message", "type",
// "param", "code"}}): the event is {"type":"error","code","message",
// "param"}, which an SDK reading an unstreamed answer takes for no body.
// An event that nests its error already is the body as it is.
func responsesErrorBody(ev []byte) []byte {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Code    any             `json:"code"`
		Message string          `json:"message"`
		Param   any             `json:"param"`
	}
	if json.Unmarshal(ev, &e) != nil || len(e.Error) > 0 && string(e.Error) != "null" {
		return ev
	}
	typ := "server_error"
	if c, ok := e.Code.(string); ok && c != "" {
		typ = c
	}
	body, err := json.Marshal(map[string]any{"error": map[string]any{"message": e.Message, "type": typ, "param": e.Param, "code": e.Code}})
	if err != nil {
		return ev
	}
	return body
}
