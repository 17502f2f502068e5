package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/kvspec"
	"github.com/kvgate/kvgate/internal/yamlstrict"
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
	// LoRA names the LoRA adapters the engine serves besides Model
	// (vLLM's --lora-modules NAME=PATH …; SGLang's --lora-paths). A
	// request whose model is one of them is routed among the endpoints
	// of Model that serve it, on the same load accounting, with its
	// block keys mixed with the adapter's name as vLLM hashes them.
	LoRA []string `yaml:"lora" json:"lora,omitempty"`
	Role Role     `yaml:"role" json:"role"`
	// Events is its KV-event PUB socket to dial (tcp://HOST:PORT); empty:
	// none (central mode, or an engine without events).
	Events string `yaml:"events" json:"events,omitempty"`
	// Replay is its replay ROUTER socket; empty: no replay.
	Replay string `yaml:"replay" json:"replay,omitempty"`
	// PrefillSpeed is its prompt tokens per second, the analytic
	// predictor's speed before live traffic teaches a better one (0: the
	// gateway's default).
	PrefillSpeed float64 `yaml:"prefill_speed" json:"prefill_speed,omitempty"`
	// DPSize > 1 declares an engine that serves DPSize data-parallel ranks
	// behind one HTTP API (vLLM --data-parallel-size with its internal load
	// balancer, SGLang --dp-size). Each rank has a KV cache, KV events and
	// metrics of its own, so Validate makes one endpoint of each (named
	// NAME/dpR, its events and replay sockets at the port + R, as the
	// engines offset them), and the gateway pins its requests to the rank
	// with X-Data-Parallel-Rank, which vLLM and SGLang both honour.
	DPSize int `yaml:"dp_size" json:"dp_size,omitempty"`
	// DPRank is the rank an endpoint made by Validate from a DPSize > 1
	// engine stands for (Ranked reports whether it is one).
	DPRank int `yaml:"-" json:"dp_rank,omitempty"`
	ranked bool
	// BootstrapPort, on a prefill endpoint, is its SGLang disaggregation
	// bootstrap port (sglang --disaggregation-bootstrap-port, 8998 by
	// default): requests prefilled there follow SGLang's P/D protocol
	// (both legs at once, bootstrap_host/port/room in their bodies)
	// instead of vLLM's NixlConnector flow. 0: vLLM's flow.
	BootstrapPort int `yaml:"bootstrap_port" json:"bootstrap_port,omitempty"`
}

// Ranked reports whether e stands for one data-parallel rank (DPRank) of
// an engine with DPSize ranks.
func (e Endpoint) Ranked() bool { return e.ranked }

// Equal reports whether e and o declare the same endpoint.
func (e Endpoint) Equal(o Endpoint) bool { return reflect.DeepEqual(e, o) }

// Serves reports whether a request for model may go to e: its model, or
// one of its LoRA adapters.
func (e Endpoint) Serves(model string) bool {
	return model == e.Model || slices.Contains(e.LoRA, model)
}

// Limits on what a spec or file may hold.
const (
	MaxEndpoints    = 4096
	maxFieldLen     = 1024
	MaxPrefillSpeed = 1e9
	// MaxLoRA bounds the adapters one endpoint declares, and
	// MaxLoRANameLen an adapter's name.
	MaxLoRA        = 1024
	MaxLoRANameLen = 256
	// MaxDPSize bounds an engine's data-parallel ranks.
	MaxDPSize = 1024
)

// ParseSpec parses the --engine text form:
//
//	name=N,url=http://HOST:PORT,model=M,lora=ADAPTER,role=both|prefill|decode,events=tcp://HOST:PORT,replay=tcp://HOST:PORT,prefill_speed=TOKENS_PER_S,dp_size=RANKS,bootstrap_port=PORT
//
// Keys may come in any order; model is required, and one of name or url.
// lora may be given once for each adapter.
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
		case "lora":
			e.LoRA = append(e.LoRA, v)
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
		case "bootstrap_port":
			return specInt(k, v, &e.BootstrapPort)
		case "dp_size":
			return specInt(k, v, &e.DPSize)
		default:
			return fmt.Errorf("unknown key %q (name, url, model, lora, role, events, replay, prefill_speed, dp_size, bootstrap_port)", k)
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

// specInt reads the integer value v of spec key k into dst (its range is
// Normalize's to check).
func specInt(k, v string, dst *int) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%s %q is not an integer", k, v)
	}
	*dst = n
	return nil
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
	if err := e.checkLoRA(); err != nil {
		return err
	}
	if e.PrefillSpeed < 0 || e.PrefillSpeed > MaxPrefillSpeed || e.PrefillSpeed != e.PrefillSpeed {
		return fmt.Errorf("prefill_speed must be in [0, %g] tokens/s, got %v", float64(MaxPrefillSpeed), e.PrefillSpeed)
	}
	if e.DPSize < 0 || e.DPSize > MaxDPSize {
		return fmt.Errorf("dp_size must be in [0, %d], got %d", MaxDPSize, e.DPSize)
	}
	if e.BootstrapPort < 0 || e.BootstrapPort > 65535 {
		return fmt.Errorf("bootstrap_port must be a port number, got %d", e.BootstrapPort)
	}
	if e.BootstrapPort > 0 && e.Role != RolePrefill {
		return fmt.Errorf("bootstrap_port is an SGLang prefill endpoint's (role=prefill), not a %s endpoint's", e.Role)
	}
	var err error
	if e.Events, err = zmqEndpoint("events", e.Events); err != nil {
		return err
	}
	e.Replay, err = zmqEndpoint("replay", e.Replay)
	return err
}

// checkLoRA checks the adapters' names: at most MaxLoRA, each non-empty,
// at most MaxLoRANameLen bytes, once, and not the base model's.
func (e *Endpoint) checkLoRA() error {
	if len(e.LoRA) > MaxLoRA {
		return fmt.Errorf("lora: %d adapters, at most %d", len(e.LoRA), MaxLoRA)
	}
	seen := make(map[string]bool, len(e.LoRA))
	for i, name := range e.LoRA {
		switch {
		case name == "" || len(name) > MaxLoRANameLen:
			return fmt.Errorf("lora[%d]: an adapter's name must be 1 to %d bytes, got %d", i, MaxLoRANameLen, len(name))
		case name == e.Model:
			return fmt.Errorf("lora[%d]: adapter %q has the base model's name", i, name)
		case seen[name]:
			return fmt.Errorf("lora[%d]: adapter %q is listed twice", i, name)
		}
		seen[name] = true
	}
	return nil
}

// ranks returns the endpoints e stands for: itself, or one for each
// data-parallel rank of an engine with DPSize > 1 (not yet made).
func (e Endpoint) ranks() ([]Endpoint, error) {
	if e.DPSize <= 1 || e.ranked {
		return []Endpoint{e}, nil
	}
	out := make([]Endpoint, e.DPSize)
	for r := range out {
		c := e
		c.Name, c.DPRank, c.ranked = RankName(e.Name, r), r, true
		var err error
		if c.Events, err = OffsetPort(e.Events, r); err != nil {
			return nil, fmt.Errorf("events: %w", err)
		}
		if c.Replay, err = OffsetPort(e.Replay, r); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		out[r] = c
	}
	return out, nil
}

// RankName is the name of data-parallel rank rank of the engine named
// name: NAME/dpR.
func RankName(name string, rank int) string { return name + "/dp" + strconv.Itoa(rank) }

// SplitRankName splits a rank's name NAME/dpR into NAME and R; any other
// name is its own, rank 0.
func SplitRankName(name string) (string, int) {
	i := strings.LastIndex(name, "/dp")
	if i < 0 {
		return name, 0
	}
	r, err := strconv.Atoi(name[i+3:])
	if err != nil || r < 0 || strconv.Itoa(r) != name[i+3:] {
		return name, 0
	}
	return name[:i], r
}

// CheckCentralMode refuses, in central mode (bind, the SUB engines dial,
// set, with ranks SUBs at its port + 0 … ranks-1), a data-parallel rank
// without events= that central mode cannot hear: vLLM's and SGLang's
// ranks dial bind's port + their rank, so an engine of more ranks than
// are bound would lose the others' events. More than one rank port
// without bind binds nothing, and is refused rather than ignored.
func CheckCentralMode(bind string, ranks int, eps []Endpoint) error {
	if bind == "" {
		if ranks > 1 {
			return fmt.Errorf("bind_events_ranks (--bind-events-ranks) %d without bind_events (--bind-events) binds nothing: it is central mode's", ranks)
		}
		return nil
	}
	for _, e := range eps {
		if e.Ranked() && e.Events == "" && e.DPRank >= max(ranks, 1) {
			return fmt.Errorf("endpoint %s is data-parallel rank %d without events=, and central mode binds %d rank port(s): set bind_events_ranks (--bind-events-ranks) to %d, or give the engine events=tcp://HOST:PORT (rank R is heard at PORT + R)", e.Name, e.DPRank, max(ranks, 1), e.DPSize)
		}
	}
	return nil
}

// OffsetPort is a tcp://HOST:PORT socket (or HOST:PORT) with its port
// moved up by n, as vLLM and SGLang place a data-parallel rank's KV-event
// sockets; "" stays "".
func OffsetPort(s string, n int) (string, error) {
	if s == "" || n == 0 {
		return s, nil
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(s, "tcp://"))
	if err != nil {
		return "", fmt.Errorf("%q: %w", s, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+n > 65535 {
		return "", fmt.Errorf("%q: rank %d's port (the port + %d) is not a port number", s, n, n)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+n)), nil
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
	if err := yamlstrict.Decode(data, &f); err != nil {
		return nil, err
	}
	return Validate(f.Endpoints)
}

// Validate normalises a list of endpoints, makes one endpoint of each
// data-parallel rank of an engine with dp_size > 1, and checks that names
// are unique, that no two share a KV-event socket, that there are at most
// MaxEndpoints in all, and that every LoRA adapter's name means one thing:
// one base model's adapter, never a model of its own.
func Validate(eps []Endpoint) ([]Endpoint, error) {
	if len(eps) > MaxEndpoints {
		return nil, fmt.Errorf("%d endpoints: at most %d", len(eps), MaxEndpoints)
	}
	b := newBuilder(len(eps))
	for i, e := range eps {
		if err := b.add(i, e); err != nil {
			return nil, err
		}
	}
	return b.out, nil
}

// ValidateEach keeps what Validate would accept of eps instead of
// refusing the list: each endpoint is kept, as given, if the endpoints
// kept so far stay valid with it (the earlier ones win a conflict), and
// refused names each one left out with its reason (by Name, or URL). For
// discovered fleets, where one bad pod or file entry must not freeze the
// rest; Validate(kept) succeeds.
func ValidateEach(eps []Endpoint) (kept []Endpoint, refused []Refused) {
	b := newBuilder(len(eps))
	for i, e := range eps {
		if err := b.add(i, e); err != nil {
			refused = append(refused, Refused{Endpoint: e, Err: err})
			continue
		}
		kept = append(kept, e)
	}
	return kept, refused
}

// Refused is an endpoint ValidateEach left out, and why.
type Refused struct {
	Endpoint Endpoint
	Err      error
}

func (r Refused) Error() string {
	return fmt.Sprintf("endpoint %s left out: %v", cmp.Or(r.Endpoint.Name, r.Endpoint.URL), r.Err)
}

// builder grows a valid list of endpoints one at a time (Validate).
type builder struct {
	out    []Endpoint
	seen   map[string]int    // rank names → the input index that has it
	socket map[string]int    // events and replay sockets → the same
	base   map[string]string // LoRA adapter → its base model
	models map[string]string // served model → an endpoint serving it
}

func newBuilder(n int) *builder {
	return &builder{out: make([]Endpoint, 0, n), seen: make(map[string]int, n), socket: map[string]int{},
		base: map[string]string{}, models: map[string]string{}}
}

// add adds eps[i], e, with its ranks, or changes nothing and says why not.
func (b *builder) add(i int, e Endpoint) error {
	if err := e.Normalize(); err != nil {
		return fmt.Errorf("endpoints[%d]: %w", i, err)
	}
	rs, err := e.ranks()
	if err != nil {
		return fmt.Errorf("endpoints[%d]: %w", i, err)
	}
	if len(b.out)+len(rs) > MaxEndpoints {
		return fmt.Errorf("endpoints[%d]: more than %d endpoints, data-parallel ranks counted", i, MaxEndpoints)
	}
	names, socks := map[string]bool{}, map[string]bool{}
	for _, r := range rs {
		if j, dup := b.seen[r.Name]; dup || names[r.Name] {
			return fmt.Errorf("endpoints[%d]: name %q already used by endpoints[%d]", i, r.Name, j)
		}
		names[r.Name] = true
		for _, sock := range []string{r.Events, r.Replay} {
			if j, dup := b.socket[sock]; sock != "" && (dup || socks[sock]) {
				return fmt.Errorf("endpoints[%d]: KV-event socket %s is already endpoints[%d]'s: each engine publishes on its own", i, sock, j)
			}
			socks[sock] = sock != ""
		}
	}
	if err := b.checkAdapters(e); err != nil {
		return err
	}
	for _, r := range rs {
		b.seen[r.Name] = i
		for _, sock := range []string{r.Events, r.Replay} {
			if sock != "" {
				b.socket[sock] = i
			}
		}
		b.out = append(b.out, r)
	}
	for _, a := range e.LoRA {
		b.base[a] = e.Model
	}
	b.models[e.Model] = e.Name
	return nil
}

// checkAdapters refuses an adapter name that two base models claim, or
// that is also a served model: a request naming it would be ambiguous.
func (b *builder) checkAdapters(e Endpoint) error {
	for _, a := range e.LoRA {
		if m, ok := b.base[a]; ok && m != e.Model {
			return fmt.Errorf("endpoint %s: LoRA adapter %q is also declared on model %q's endpoints", e.Name, a, m)
		}
		if other, ok := b.models[a]; ok {
			return fmt.Errorf("endpoint %s: LoRA adapter %q is model %q elsewhere (endpoint %s)", e.Name, a, a, other)
		}
	}
	if m, ok := b.base[e.Model]; ok {
		return fmt.Errorf("endpoint %s: its model %q is a LoRA adapter of model %q elsewhere", e.Name, e.Model, m)
	}
	return nil
}
