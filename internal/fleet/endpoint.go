package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/internal/kvspec"
)

// Endpoint is one engine as an operator declares it.
type Endpoint struct {
	// Name identifies the endpoint in the index, logs and metrics; it
	// defaults to the URL's host:port (vLLM's KV-event topic uses
	// host:port too).
	Name string `yaml:"name" json:"name"`
	// URL is the base URL of its OpenAI-compatible HTTP API, e.g.
	// http://10.0.0.5:8000. kvindex, which never proxies, may leave it
	// empty.
	URL   string `yaml:"url" json:"url,omitempty"`
	Model string `yaml:"model" json:"model"`
	Role  Role   `yaml:"role" json:"role"`
	// Events is its KV-event PUB socket to dial (tcp://HOST:PORT); empty:
	// none (central mode, or an engine without events).
	Events string `yaml:"events" json:"events,omitempty"`
	// Replay is its replay ROUTER socket; empty: no replay.
	Replay string `yaml:"replay" json:"replay,omitempty"`
	// PrefillSpeed is its prompt tokens per second, the analytic
	// predictor's speed before live traffic teaches a better one (0: the
	// gateway's default).
	PrefillSpeed float64 `yaml:"prefill_speed" json:"prefill_speed,omitempty"`
}

// Limits on what a spec or file may hold.
const (
	MaxEndpoints    = 4096
	maxFieldLen     = 1024
	MaxPrefillSpeed = 1e9
)

// ParseSpec parses the --engine text form:
//
//	name=N,url=http://HOST:PORT,model=M,role=both|prefill|decode,events=tcp://HOST:PORT,replay=tcp://HOST:PORT,prefill_speed=TOKENS_PER_S
//
// Keys may come in any order; model is required, and one of name or url.
func ParseSpec(s string) (Endpoint, error) {
	var e Endpoint
	err := kvspec.Each(s, func(k, v string) error {
		switch k {
		case "name":
			e.Name = v
		case "url":
			e.URL = v
		case "model":
			e.Model = v
		case "role":
			r, err := ParseRole(v)
			if err != nil {
				return err
			}
			e.Role = r
		case "events":
			e.Events = v
		case "replay":
			e.Replay = v
		case "prefill_speed":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("prefill_speed %q is not a number", v)
			}
			e.PrefillSpeed = f
		default:
			return fmt.Errorf("unknown key %q (name, url, model, role, events, replay, prefill_speed)", k)
		}
		return nil
	})
	if err == nil {
		err = e.Normalize()
	}
	if err != nil {
		return e, fmt.Errorf("endpoint %q: %w", s, err)
	}
	return e, nil
}

// Normalize fills defaults (name from the URL, tcp:// on bare socket
// addresses) and validates every field.
func (e *Endpoint) Normalize() error {
	if e.Model == "" {
		return errors.New("model is required")
	}
	for _, f := range []struct{ name, v string }{{"name", e.Name}, {"url", e.URL}, {"model", e.Model}, {"events", e.Events}, {"replay", e.Replay}} {
		if len(f.v) > maxFieldLen {
			return fmt.Errorf("%s is longer than %d bytes", f.name, maxFieldLen)
		}
	}
	if e.URL != "" {
		u, err := url.Parse(e.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("url %q must be http://HOST:PORT or https://HOST:PORT", e.URL)
		}
		e.URL = strings.TrimRight(e.URL, "/")
		if e.Name == "" {
			e.Name = u.Host
		}
	}
	if e.Name == "" {
		return errors.New("name= or url= is required")
	}
	if e.PrefillSpeed < 0 || e.PrefillSpeed > MaxPrefillSpeed || e.PrefillSpeed != e.PrefillSpeed {
		return fmt.Errorf("prefill_speed must be in [0, %g] tokens/s, got %v", float64(MaxPrefillSpeed), e.PrefillSpeed)
	}
	var err error
	if e.Events, err = zmqEndpoint("events", e.Events); err != nil {
		return err
	}
	e.Replay, err = zmqEndpoint("replay", e.Replay)
	return err
}

// zmqEndpoint accepts host:port or tcp://host:port.
func zmqEndpoint(field, s string) (string, error) {
	if s == "" {
		return "", nil
	}
	addr := s
	if rest, ok := strings.CutPrefix(s, "tcp://"); ok {
		addr = rest
	} else if strings.Contains(s, "://") {
		return "", fmt.Errorf("%s %q: only tcp:// sockets are supported", field, s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("%s %q: %w", field, s, err)
	}
	return "tcp://" + addr, nil
}

// File is the YAML form of a list of endpoints:
//
//	endpoints:
//	  - {name: a, url: http://10.0.0.5:8000, model: m, role: prefill, events: tcp://10.0.0.5:5557}
type File struct {
	Endpoints []Endpoint `yaml:"endpoints"`
}

// ParseFile parses and validates a YAML endpoint list; unknown fields are
// errors, and each error names the entry and field.
func ParseFile(data []byte) ([]Endpoint, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return Validate(f.Endpoints)
}

// Validate normalises a list of endpoints and checks that names are unique.
func Validate(eps []Endpoint) ([]Endpoint, error) {
	if len(eps) > MaxEndpoints {
		return nil, fmt.Errorf("%d endpoints: at most %d", len(eps), MaxEndpoints)
	}
	out := make([]Endpoint, len(eps))
	seen := make(map[string]int, len(eps))
	for i, e := range eps {
		if err := e.Normalize(); err != nil {
			return nil, fmt.Errorf("endpoints[%d]: %w", i, err)
		}
		if j, dup := seen[e.Name]; dup {
			return nil, fmt.Errorf("endpoints[%d]: name %q already used by endpoints[%d]", i, e.Name, j)
		}
		seen[e.Name] = i
		out[i] = e
	}
	return out, nil
}
