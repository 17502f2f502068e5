package yamlstrict

import (
	"encoding"
	"fmt"
	"reflect"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkShape walks the document node n beside the type t it decodes
// into, refusing what yaml.v3 would take in silence or name in Go's terms:
// a fraction where an integer belongs (yaml.v3 truncates 1.9 to 1), a
// duration without its unit (yaml.v3 names time.Duration), and a list or
// mapping where another kind belongs (yaml.v3 names the Go type). path is
// the key path so far, for the message. Aliases are not followed (the
// decode that follows checks them; following them here could cost as
// much as the aliases multiply), nor values of types that decode
// themselves.
func checkShape(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		return checkShape(n.Content[0], t, path)
	}
	if n.Kind == yaml.AliasNode || n.Tag == "!!null" || reflect.PointerTo(t).Implements(unmarshalerType) ||
		t != durationType && reflect.PointerTo(t).Implements(textType) {
		return nil
	}
	where := func(what string) error {
		return fmt.Errorf("line %d: %s: %s", n.Line, strings.TrimPrefix(path, "."), what)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return where(kindOf(n) + " where a mapping of settings belongs")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if ft, ok := fieldType(t, n.Content[i].Value); ok {
				if err := checkShape(n.Content[i+1], ft, path+"."+n.Content[i].Value); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return where(kindOf(n) + " where a mapping belongs")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkShape(n.Content[i+1], t.Elem(), path+"."+n.Content[i].Value); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return where(kindOf(n) + " where a list belongs")
		}
		for i, c := range n.Content {
			if err := checkShape(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Interface:
	default:
		if n.Kind != yaml.ScalarNode {
			return where(kindOf(n) + " where a single value belongs")
		}
		return checkScalar(n, t, where)
	}
	return nil
}

// checkScalar checks a scalar bound for a number of type t.
func checkScalar(n *yaml.Node, t reflect.Type, where func(string) error) error {
	switch {
	case t == durationType && n.Tag == "!!int":
		return where(fmt.Sprintf("%s needs its unit, e.g. %ss or %sms", n.Value, n.Value, n.Value))
	case t == durationType && n.Tag == "!!float":
		return where(fmt.Sprintf("%s needs its unit, e.g. %ss", n.Value, n.Value))
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 && n.Tag == "!!float":
		return where(fmt.Sprintf("%s is not an integer", n.Value))
	}
	return nil
}

// fieldType is the type of t's field whose yaml key is key (in an
// inlined struct too).
func fieldType(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if got, ok := fieldType(ft, key); ok {
					return got, true
				}
			}
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if name == key {
			return f.Type, true
		}
	}
	return nil, false
}

// kindOf names a node's kind as the file shows it.
func kindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}
