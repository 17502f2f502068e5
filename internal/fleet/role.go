// Package fleet holds what kvgate knows of the engines it fronts before any
// request arrives: an endpoint's identity (name, URL, model, role, KV-event
// sockets), its role in a disaggregated fleet, and the text and YAML forms
// an operator writes them in. Every command (serve, kvindex, sim, engine)
// uses these types, so an endpoint means the same thing everywhere.
package fleet

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Role is what an endpoint does: prefill and decode (aggregated), only
// prefill, or only decode.
type Role uint8

// The roles. The zero value is RoleBoth.
const (
	RoleBoth Role = iota
	RolePrefill
	RoleDecode
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	default:
		return "both"
	}
}

// ParseRole parses "both" (or ""), "prefill" or "decode".
func ParseRole(s string) (Role, error) {
	switch s {
	case "both", "":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return 0, fmt.Errorf("unknown role %q (both, prefill, decode)", s)
}

// CanPrefill reports whether the role computes prompts.
func (r Role) CanPrefill() bool { return r != RoleDecode }

// CanDecode reports whether the role generates tokens.
func (r Role) CanDecode() bool { return r != RolePrefill }

// MarshalText implements encoding.TextMarshaler (JSON and YAML use it).
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalYAML reads a role in a YAML file, naming its line and key in
// an error (yaml.v3 passes a TextUnmarshaler's error on without them).
func (r *Role) UnmarshalYAML(n *yaml.Node) error {
	if err := r.UnmarshalText([]byte(n.Value)); err != nil {
		return fmt.Errorf("line %d: role: %w", n.Line, err)
	}
	return nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}
