package openai

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// KVTransferParams are vLLM's NixlConnector kv_transfer_params.
//
// In a leg-1 request (to a prefill engine) DoRemoteDecode is true and the
// remote fields are null. The prefill engine answers with top-level
// kv_transfer_params whose DoRemotePrefill is true and whose remote fields
// say where the KV is; a leg-2 request (to a decode engine) carries those.
type KVTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	RemoteRequestID string `json:"remote_request_id,omitempty"`
	TPSize          int    `json:"tp_size,omitempty"`
	// RemoteNumTokens is the prompt tokens whose KV the prefill engine
	// holds (vLLM's newer NixlConnector answers say it).
	RemoteNumTokens int `json:"remote_num_tokens,omitempty"`
}

// KVTransferAnswer is a prefill engine's answer kv_transfer_params, as
// vLLM's NixlConnector writes them now: remote_block_ids one list per
// KV-cache group ([[35, 36]]; flat until 2026-12-04), with
// remote_num_tokens. The decode leg reads either form
// (ParseKVTransferParams).
type KVTransferAnswer struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteBlockIDs  [][]int `json:"remote_block_ids"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	RemoteRequestID string  `json:"remote_request_id,omitempty"`
	TPSize          int     `json:"tp_size,omitempty"`
	RemoteNumTokens int     `json:"remote_num_tokens"`
}

// Bounds on kv_transfer_params values.
const (
	maxBlockID = math.MaxInt32
	maxTPSize  = 1 << 16
)

// leg1KVTransferParams is what a prefill engine receives (DESIGN.md).
const leg1KVTransferParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// ParseKVTransferParams validates raw kv_transfer_params. Empty or null
// raw gives nil. With do_remote_prefill true, remote_engine_id,
// remote_host (non-empty strings), remote_port (1..65535) and
// remote_block_ids (integers in [0, 2^31)) are required. Errors are 400s.
func ParseKVTransferParams(raw json.RawMessage) (*KVTransferParams, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || isNull(raw) {
		return nil, nil
	}
	notObject := BadRequest("kv_transfer_params must be a JSON object").WithParam("kv_transfer_params")
	if !valid(raw) {
		return nil, notObject
	}
	ms, err := objectMembers(raw, "kv_transfer_params")
	if err != nil {
		return nil, notObject
	}
	val := func(k string) []byte {
		if m := find(ms, k); m != nil && !isNull(raw[m.v0:m.v1]) {
			return raw[m.v0:m.v1]
		}
		return nil
	}
	p := &KVTransferParams{}
	for _, f := range []struct {
		key string
		dst *bool
	}{{"do_remote_decode", &p.DoRemoteDecode}, {"do_remote_prefill", &p.DoRemotePrefill}} {
		if v := val(f.key); v != nil {
			if *f.dst, err = parseStrictBool("kv_transfer_params."+f.key, v); err != nil {
				return nil, err
			}
		}
	}
	if p.DoRemoteDecode && p.DoRemotePrefill {
		return nil, BadRequest("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true").WithParam("kv_transfer_params")
	}
	if !p.DoRemotePrefill {
		return p, nil
	}
	var missing, bad []string
	check := func(key string, parse func([]byte) bool) {
		switch v := val(key); {
		case v == nil:
			missing = append(missing, key)
		case !parse(v):
			bad = append(bad, key)
		}
	}
	check("remote_engine_id", func(v []byte) bool { return nonEmptyString(v, &p.RemoteEngineID) })
	check("remote_host", func(v []byte) bool { return nonEmptyString(v, &p.RemoteHost) })
	check("remote_port", func(v []byte) bool { return intIn(v, 1, 65535, &p.RemotePort) })
	check("remote_block_ids", func(v []byte) bool { return blockIDs(v, &p.RemoteBlockIDs) })
	if v := val("remote_request_id"); v != nil && !nonEmptyString(v, &p.RemoteRequestID) {
		bad = append(bad, "remote_request_id")
	}
	if v := val("tp_size"); v != nil && !intIn(v, 1, maxTPSize, &p.TPSize) {
		bad = append(bad, "tp_size")
	}
	if v := val("remote_num_tokens"); v != nil && !intIn(v, 0, math.MaxInt32, &p.RemoteNumTokens) {
		bad = append(bad, "remote_num_tokens")
	}
	if len(missing)+len(bad) > 0 {
		var parts []string
		if len(missing) > 0 {
			parts = append(parts, "missing "+strings.Join(missing, ", "))
		}
		if len(bad) > 0 {
			parts = append(parts, "malformed "+strings.Join(bad, ", ")+
				" (remote_engine_id, remote_host and remote_request_id are non-empty strings, remote_port a port number, remote_block_ids a list of block ids (or one KV-cache group's list of them), tp_size a positive integer, remote_num_tokens a count)")
		}
		return nil, BadRequest("kv_transfer_params with do_remote_prefill=true: %s", strings.Join(parts, "; ")).WithParam("kv_transfer_params")
	}
	return p, nil
}

func nonEmptyString(v []byte, dst *string) bool {
	if v[0] != '"' {
		return false
	}
	s, err := unquote(v)
	*dst = s
	return err == nil && s != ""
}

func intIn(v []byte, lo, hi int64, dst *int) bool {
	n, err := parseInt("", v)
	if err != nil || n == nil || *n < lo || *n > hi {
		return false
	}
	*dst = int(*n)
	return true
}

// blockIDs reads remote_block_ids: a list of block ids, or, as vLLM's
// NixlConnector answers now, one list per KV-cache group ([[1, 2, 3]]),
// of which a one-group engine (kvgate's emulator) takes one.
func blockIDs(v []byte, dst *[]int) bool {
	if i := skipSpace(v, 0); i < len(v) && v[i] == '[' {
		if j := skipSpace(v, i+1); j < len(v) && v[j] == '[' {
			var groups []json.RawMessage
			if json.Unmarshal(v, &groups) != nil || len(groups) != 1 {
				return false
			}
			v = groups[0]
		}
	}
	ids, err := tokenIDs(v, "remote_block_ids", "kv_transfer_params")
	if err != nil {
		return false
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		if id > maxBlockID {
			return false
		}
		out[i] = int(id)
	}
	*dst = out
	return true
}

// StripRoutingParams returns the body without kv_transfer_params and
// without SGLang's bootstrap_host, bootstrap_port and bootstrap_room.
//
// A gateway must call it (or build the legs with PrefillBody, DecodeBody
// or BootstrapBody, which replace them) on every client request: leg 2 of
// vLLM's P/D flow makes a decode engine connect to remote_host:remote_port,
// and SGLang's decode engine connects to bootstrap_host:bootstrap_port, so
// client-supplied values would let any client aim an engine at any
// address, and a forged do_remote_decode would make a prefill engine hold
// KV blocks for nobody. They are only ever built by the gateway, from its
// own prefill engine's answer or endpoint.
func (r *Request) StripRoutingParams() []byte {
	var edits []Edit
	for _, k := range routingKeys {
		if r.Has(k) {
			edits = append(edits, Edit{Key: k})
		}
	}
	if len(edits) == 0 {
		return r.Raw
	}
	return r.Rewrite(edits...)
}

// routingKeys are the body members that aim engines at each other.
var routingKeys = [...]string{"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"}

// BootstrapBody is the body of both legs of SGLang's P/D protocol (as
// SGLang's router sends them, at once, to the prefill and the decode
// engine): the client's body (streaming allowed) without kv_transfer_params,
// with bootstrap_host and bootstrap_port naming the prefill engine's
// bootstrap server and bootstrap_room the transfer's id (SGLang keeps it
// as an int64: room must be below 2^63).
func (r *Request) BootstrapBody(host string, port int, room uint64) []byte {
	h, _ := json.Marshal(host)
	return r.Rewrite(
		Edit{Key: "kv_transfer_params"},
		Edit{Key: "bootstrap_host", Value: h},
		Edit{Key: "bootstrap_port", Value: json.RawMessage(strconv.Itoa(port))},
		Edit{Key: "bootstrap_room", Value: json.RawMessage(strconv.FormatUint(room&math.MaxInt64, 10))},
	)
}

// BootstrapBatchBody is BootstrapBody for a batch (SGLang's router's
// batch: a completion's prompt given as a list, /generate's text or
// input_ids lists of prompts, a chat's n > 1): bootstrap_host,
// bootstrap_port and bootstrap_room are lists, one element a prompt, the
// rooms given (one each; each below 2^63). SGLang's own routers send
// batches so (its Rust router for the OpenAI APIs, mini_lb for
// /generate); an SGLang whose engine takes only scalars for a batch
// expands the room to room + i, which on a prefill engine of several
// data-parallel ranks points the batch's prompts at other ranks.
func (r *Request) BootstrapBatchBody(host string, port int, rooms []uint64) []byte {
	n := len(rooms)
	hosts, ports := make([]string, n), make([]int, n)
	rs := make([]int64, n)
	for i, room := range rooms {
		hosts[i], ports[i], rs[i] = host, port, int64(room&math.MaxInt64)
	}
	h, _ := json.Marshal(hosts)
	pl, _ := json.Marshal(ports)
	rl, _ := json.Marshal(rs)
	return r.Rewrite(
		Edit{Key: "kv_transfer_params"},
		Edit{Key: "bootstrap_host", Value: h},
		Edit{Key: "bootstrap_port", Value: pl},
		Edit{Key: "bootstrap_room", Value: rl},
	)
}

// PrefillBody is the body of leg 1, to the prefill engine (DESIGN.md,
// NixlConnector): the client's body with stream=false, stream_options
// removed, max_tokens=1 (and max_completion_tokens=1 when present),
// min_tokens removed and kv_transfer_params asking for a remote decode.
func (r *Request) PrefillBody() []byte {
	edits := []Edit{
		{Key: "stream", Value: json.RawMessage("false")},
		{Key: "stream_options"},
		{Key: "max_tokens", Value: json.RawMessage("1")},
		{Key: "min_tokens"},
		{Key: "kv_transfer_params", Value: json.RawMessage(leg1KVTransferParams)},
	}
	if r.Has("max_completion_tokens") {
		edits = append(edits, Edit{Key: "max_completion_tokens", Value: json.RawMessage("1")})
	}
	return r.Rewrite(append(edits, r.bootstrapStripped()...)...)
}

// bootstrapStripped removes a client's SGLang bootstrap members, which aim
// engines at each other, from a leg of vLLM's P/D flow (the
// kv_transfer_params are the leg's own).
func (r *Request) bootstrapStripped() []Edit {
	var edits []Edit
	for _, k := range routingKeys {
		if k != "kv_transfer_params" && r.Has(k) {
			edits = append(edits, Edit{Key: k})
		}
	}
	return edits
}

// DecodeBody is the body of leg 2, to the decode engine: the client's
// body (streaming allowed) with kv_transfer_params set to params, the
// top-level kv_transfer_params of the prefill engine's answer (see
// ResponseKVTransferParams), unchanged once CheckPrefillAnswer passes.
func (r *Request) DecodeBody(params json.RawMessage) ([]byte, error) {
	params = json.RawMessage(strings.TrimSpace(string(params)))
	if err := CheckPrefillAnswer(params); err != nil {
		return nil, err
	}
	return r.Rewrite(append(r.bootstrapStripped(), Edit{Key: "kv_transfer_params", Value: params})...), nil
}

// CheckPrefillAnswer checks the kv_transfer_params of a prefill engine's
// answer before they go into leg 2: a JSON object that asks for a remote
// prefill (do_remote_prefill true, do_remote_decode not true). Its other
// fields are the KV connector's and pass through as the engine wrote
// them, as vLLM's own P/D proxies pass them: NixlConnector's
// remote_engine_id, remote_block_ids, remote_host, remote_port,
// remote_request_id and tp_size, another connector's fields of its own
// (remote_handshake_port, say), llm-d-inference-sim's placeholders
// ("remote_block_ids":["DUMMY_ID"]). The decode engine, which uses them,
// judges them; they never come from a client (StripRoutingParams).
func CheckPrefillAnswer(params json.RawMessage) error {
	raw := json.RawMessage(strings.TrimSpace(string(params)))
	if len(raw) == 0 || isNull(raw) || !valid(raw) {
		return fmt.Errorf("prefill answer: kv_transfer_params are not a JSON object")
	}
	ms, err := objectMembers(raw, "kv_transfer_params")
	if err != nil {
		return fmt.Errorf("prefill answer: kv_transfer_params are not a JSON object")
	}
	flag := func(key string) (bool, error) {
		m := find(ms, key)
		if m == nil || isNull(raw[m.v0:m.v1]) {
			return false, nil
		}
		return parseStrictBool("kv_transfer_params."+key, raw[m.v0:m.v1])
	}
	decode, err := flag("do_remote_decode")
	if err != nil {
		return fmt.Errorf("prefill answer: %w", err)
	}
	prefill, err := flag("do_remote_prefill")
	if err != nil {
		return fmt.Errorf("prefill answer: %w", err)
	}
	if !prefill || decode {
		return fmt.Errorf("prefill answer: kv_transfer_params do not ask for a remote prefill (do_remote_prefill true, do_remote_decode not true)")
	}
	return nil
}

// ResponseKVTransferParams returns the top-level kv_transfer_params of a
// (non-streamed) completion or chat completion response; nil when absent
// or null.
func ResponseKVTransferParams(body []byte) (json.RawMessage, error) {
	if !valid(body) {
		return nil, fmt.Errorf("response is not valid JSON")
	}
	ms, err := objectMembers(body, "response")
	if err != nil {
		return nil, err
	}
	m := find(ms, "kv_transfer_params")
	if m == nil || isNull(body[m.v0:m.v1]) {
		return nil, nil
	}
	return json.RawMessage(body[m.v0:m.v1]), nil
}

// ResponseEndedAtFirstToken reports whether a prefill leg's answer (vLLM,
// max_tokens 1) ended for a reason of its own: every choice finished,
// none for its length ("stop": the first token was a stop token or
// completed a stop string). vLLM's NixlConnector keeps a prompt's KV for a
// remote decode only when its request stopped at max_tokens, and answers
// such a prefill with kv_transfer_params null; vLLM's own P/D proxy then
// sends the decode leg without them and the decode engine computes the
// prompt. Without a connector every answer stops at its length.
func ResponseEndedAtFirstToken(body []byte) bool {
	var r struct {
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(body, &r) != nil || len(r.Choices) == 0 {
		return false
	}
	for _, c := range r.Choices {
		if c.FinishReason == nil || *c.FinishReason == "" || *c.FinishReason == "length" {
			return false
		}
	}
	return true
}

// ResponseCachedTokens returns the prompt tokens a non-streamed answer's
// usage reports as cached (usage.prompt_tokens_details.cached_tokens:
// the engine's own prefix-cache hit) and whether it reports them; an
// answer that is not JSON, has no such field or a negative count reports
// none.
func ResponseCachedTokens(body []byte) (int, bool) {
	var r struct {
		Usage *struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil || r.Usage.Details == nil || r.Usage.Details.Cached == nil || *r.Usage.Details.Cached < 0 {
		return 0, false
	}
	return *r.Usage.Details.Cached, true
}
