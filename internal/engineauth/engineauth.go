// Package engineauth authenticates kvgate's own requests to engines that
// require an API key (vLLM's --api-key, SGLang's --api-key): every request
// a client makes carries "Authorization: Bearer KEY".
package engineauth

import (
	"errors"
	"net/http"
	"strings"
)

// EnvVar is the environment variable that gives the key (kvgate serve;
// a config field may give it instead), as VLLM_API_KEY gives vLLM's.
const EnvVar = "KVGATE_ENGINE_API_KEY"

// Check refuses a key that cannot go in a header: empty once trimmed of
// spaces, over 4 KiB, or with a control character.
func Check(key string) error {
	switch {
	case strings.TrimSpace(key) == "":
		return errors.New("engine API key is empty")
	case strings.TrimSpace(key) != key:
		// A header's value is read trimmed: such a key never matches.
		return errors.New("engine API key begins or ends with a space")
	case len(key) > 4096:
		return errors.New("engine API key is longer than 4096 bytes")
	case strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errors.New("engine API key has a control character")
	}
	return nil
}

// Transport is base with every request authenticated with key (base when
// key is ""; http.DefaultTransport when base is nil). The key replaces a
// client's own Authorization: the gateway is the engines' client.
func Transport(base http.RoundTripper, key string) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if key == "" {
		return base
	}
	return &bearer{base: base, value: "Bearer " + key}
}

type bearer struct {
	base  http.RoundTripper
	value string
}

// RoundTrip implements http.RoundTripper; the request is cloned, as the
// interface requires of a RoundTripper that changes it. A redirect to
// another host is sent without the key (it went wherever an engine
// redirected; Go's client drops a caller's Authorization there too).
func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if prev := r.Response; prev != nil && prev.Request != nil && prev.Request.URL.Host != r.URL.Host {
		return b.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.value)
	return b.base.RoundTrip(r)
}
