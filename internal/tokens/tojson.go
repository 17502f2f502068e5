package tokens

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// The tojson filter as transformers gives it to chat templates (its
// chat-template environment replaces Jinja's): Python's json.dumps with
// ensure_ascii=False and the filter's indent, separators and sort_keys.
// The template library's own differed where templates meet it: with
// indent (Llama 3.1–3.3 render tools with tojson(indent=4)) it sorted
// the keys and escaped <, > and &, and everywhere it wrote floats as Go
// does (1.0 as 1) and escaped U+2028; the prompt's tokens then differed
// from the engine's, and with them its blocks' keys.

// tojsonFilterVar is the name of the filter that replaces the library's
// tojson: a template's "| tojson" is compiled as "| kvgate_tojson"
// (useTojson), a filter the library does not have, which it looks up in
// the render's variables (its own filters cannot be replaced).
const tojsonFilterVar = "kvgate_tojson"

// tojsonUse matches a template's uses of the tojson filter.
var tojsonUse = regexp.MustCompile(`\|(\s*)tojson\b`)

// useTojson is template src with its tojson filters replaced by
// tojsonFilterVar.
func useTojson(src string) string {
	return tojsonUse.ReplaceAllString(src, "|${1}"+tojsonFilterVar)
}

// pyTojson implements the filter.
func pyTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	d := pyDumper{item: ", ", key: ": "}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			d.indent, d.indented = strings.Repeat(" ", int(min(max(v.AsInt(), 0), 64))), true
		case v.IsString():
			d.indent, d.indented = v.AsString(), true
		default:
			return jinja.Value{}, fmt.Errorf("tojson: indent must be an integer or a string")
		}
		d.item = ","
	}
	if v, ok := kwargs["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || len(v.AsList().Items) != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Value{}, fmt.Errorf("tojson: separators must be two strings")
		}
		d.item, d.key = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := kwargs["sort_keys"]; ok && v.IsTruthy() {
		d.sortKeys = true
	}
	var b strings.Builder
	if err := d.dump(&b, args[0], 0); err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewString(b.String()), nil
}

// pyDumper writes values as json.dumps does.
type pyDumper struct {
	item, key, indent  string
	indented, sortKeys bool
}

// maxTojsonDepth bounds the nesting dump follows.
const maxTojsonDepth = 256

func (d *pyDumper) dump(b *strings.Builder, v jinja.Value, depth int) error {
	if depth > maxTojsonDepth {
		return fmt.Errorf("tojson: nested too deep")
	}
	switch {
	case v.IsNone(), v.IsUndefined(), v.IsCallable():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		s, err := pyFloat(v.AsFloat())
		if err != nil {
			return err
		}
		b.WriteString(s)
	case v.IsString():
		pyString(b, v.AsString())
	case v.IsList():
		items := v.AsList().Items
		return d.container(b, '[', ']', len(items), depth, func(i int) error { return d.dump(b, items[i], depth+1) })
	case v.IsDict():
		dict := v.AsDict()
		keys := dict.Keys
		if d.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		return d.container(b, '{', '}', len(keys), depth, func(i int) error {
			pyString(b, keys[i])
			b.WriteString(d.key)
			return d.dump(b, dict.Data[keys[i]], depth+1)
		})
	default:
		pyString(b, v.String())
	}
	return nil
}

// separate starts the i-th member of a container at depth.
// container writes a list or dict of n items between open and close, as
// json.dumps lays them out (empty: the two alone), item writing the i-th.
func (d *pyDumper) container(b *strings.Builder, open, close byte, n, depth int, item func(i int) error) error {
	b.WriteByte(open)
	if n == 0 {
		b.WriteByte(close)
		return nil
	}
	for i := range n {
		d.separate(b, i, depth+1)
		if err := item(i); err != nil {
			return err
		}
	}
	d.close(b, depth)
	b.WriteByte(close)
	return nil
}

func (d *pyDumper) separate(b *strings.Builder, i, depth int) {
	if i > 0 {
		b.WriteString(d.item)
	}
	if d.indented {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat(d.indent, depth))
	}
}

// close ends a container at depth.
func (d *pyDumper) close(b *strings.Builder, depth int) {
	if d.indented {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat(d.indent, depth))
	}
}

// pyFloat is f as Python's repr writes it (json.dumps's floats): the
// shortest digits, fixed from 1e-4 to below 1e16 with ".0" when whole,
// else an exponent of at least two digits (1e+16, 1.5e-05).
func pyFloat(f float64) (string, error) {
	switch {
	case math.IsNaN(f):
		return "NaN", nil
	case math.IsInf(f, 1):
		return "Infinity", nil
	case math.IsInf(f, -1):
		return "-Infinity", nil
	}
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0", nil
		}
		return "0.0", nil
	}
	exp := int(math.Floor(math.Log10(math.Abs(f))))
	// Log10 can be off by one at powers of ten: the 'e' form decides.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	if i := strings.IndexByte(e, 'e'); i >= 0 {
		exp, _ = strconv.Atoi(e[i+1:])
	}
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s, nil
	}
	i := strings.IndexByte(e, 'e')
	mant, x := e[:i], e[i+1:]
	sign := x[0]
	digits := strings.TrimLeft(x[1:], "0")
	for len(digits) < 2 {
		digits = "0" + digits
	}
	return mant + "e" + string(sign) + digits, nil
}

// pyString writes s as json.dumps with ensure_ascii=False does: quotes,
// backslashes and control characters escaped, everything else as is.
func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
