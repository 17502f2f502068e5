// Package yamlstrict decodes kvgate's YAML files (configs, endpoint lists,
// planner phases) strictly: a key that is not a setting is an error, and
// the error names the key and its line in the file's terms, not in the Go
// types' the file decodes into.
package yamlstrict

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"

	"gopkg.in/yaml.v3"
)

// Decode decodes data into v, refusing unknown keys, a second document,
// a fraction where an integer belongs and a duration without its unit
// (checkShape). An empty document leaves v as it is and returns nil (the
// caller decides whether that is an error).
func Decode(data []byte, v any) error {
	var doc, next yaml.Node
	nodes := yaml.NewDecoder(bytes.NewReader(data))
	if err := nodes.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	if err := nodes.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return err
		}
		// A second document was ignored in silence (its keys never
		// checked) until 2026-12-04.
		return fmt.Errorf("line %d: a second YAML document (after ---): a file holds one", max(next.Line, 1))
	}
	if err := checkShape(&doc, reflect.TypeOf(v), ""); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return clean(err)
	}
	return nil
}

// unknownField is yaml.v3's wording of an unknown key.
var unknownField = regexp.MustCompile(`field (\S+) not found in type (struct \{.*\}|\S+)`)

// clean rewords yaml.v3's errors that name Go types: "line 3: field
// bogus not found in type main.serveConfig" becomes "line 3: bogus is not
// a setting here". Other errors are returned as they are.
func clean(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	out := make([]string, len(te.Errors))
	changed := false
	for i, e := range te.Errors {
		out[i] = unknownField.ReplaceAllString(e, "$1 is not a setting here")
		changed = changed || out[i] != e
	}
	if !changed {
		return err
	}
	return &yaml.TypeError{Errors: out}
}
