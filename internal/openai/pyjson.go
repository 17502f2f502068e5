package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// PythonJSON is the JSON value raw as Python's json.dumps writes what
// json.loads read from it (vLLM writes a Messages API tool call's input
// so, as its arguments): ", " and ": " between members and items,
// non-ASCII escaped (ensure_ascii), a number with a fraction or an
// exponent as Python's repr of the float, members in the order sent (a
// key given twice: its first place, its last value, as a dict keeps it).
func PythonJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := writePython(&b, dec, 0); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err == nil {
		return "", errors.New("more than one JSON value")
	}
	return b.String(), nil
}

// maxPythonDepth bounds the nesting PythonJSON follows (Python's own
// recursion limit is about a thousand).
const maxPythonDepth = 512

func writePython(b *strings.Builder, dec *json.Decoder, depth int) error {
	if depth > maxPythonDepth {
		return errors.New("JSON nested too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			b.WriteByte('[')
			for n := 0; dec.More(); n++ {
				if n > 0 {
					b.WriteString(", ")
				}
				if err := writePython(b, dec, depth+1); err != nil {
					return err
				}
			}
			b.WriteByte(']')
			_, err = dec.Token()
			return err
		}
		return writePythonObject(b, dec, depth)
	case string:
		writePythonString(b, t)
	case json.Number:
		b.WriteString(pythonNumber(string(t)))
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case nil:
		b.WriteString("null")
	}
	return nil
}

// writePythonObject writes an object's members (its '{' read).
func writePythonObject(b *strings.Builder, dec *json.Decoder, depth int) error {
	var keys []string
	vals := map[string]string{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		var v strings.Builder
		if err := writePython(&v, dec, depth+1); err != nil {
			return err
		}
		key := k.(string)
		if _, ok := vals[key]; !ok {
			keys = append(keys, key)
		}
		vals[key] = v.String()
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		writePythonString(b, k)
		b.WriteString(": ")
		b.WriteString(vals[k])
	}
	b.WriteByte('}')
	return nil
}

// writePythonString writes s as json.dumps does with ensure_ascii.
func writePythonString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || r > 0x7e:
			if r == utf8.RuneError {
				r = 0xfffd
			}
			units := []uint16{uint16(r)}
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				units = []uint16{uint16(r1), uint16(r2)}
			}
			for _, u := range units {
				b.WriteString(`\u`)
				b.WriteByte(hex[u>>12&0xf])
				b.WriteByte(hex[u>>8&0xf])
				b.WriteByte(hex[u>>4&0xf])
				b.WriteByte(hex[u&0xf])
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// pythonNumber is a JSON number as json.dumps writes what json.loads
// read: an integer as it is, anything else as Python's repr of the
// float (the shortest digits that read back; fixed notation from 1e-4
// to below 1e16, else an exponent of at least two digits).
func pythonNumber(s string) string {
	if !strings.ContainsAny(s, ".eE") {
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && math.IsInf(f, 0):
		if f > 0 {
			return "Infinity"
		}
		return "-Infinity"
	case err != nil:
		return s
	case f == 0:
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	sign := ""
	if mant[0] == '-' {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	if decpt := exp + 1; decpt > -4 && decpt <= 16 {
		switch {
		case decpt <= 0:
			return sign + "0." + strings.Repeat("0", -decpt) + digits
		case decpt >= len(digits):
			return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
		}
		return sign + digits[:decpt] + "." + digits[decpt:]
	}
	out := sign + digits[:1]
	if len(digits) > 1 {
		out += "." + digits[1:]
	}
	es := "+"
	if exp < 0 {
		es, exp = "-", -exp
	}
	return out + "e" + es + pad2(exp)
}

func pad2(n int) string {
	if n < 10 {
		return "0" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}
