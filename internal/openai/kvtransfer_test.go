package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseKVTransferParams(t *testing.T) {
	full := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p","remote_host":"10.0.0.1","remote_port":8001,"remote_block_ids":[3,4],"remote_request_id":"r","tp_size":1}`
	p, err := ParseKVTransferParams(json.RawMessage(full))
	want := &KVTransferParams{DoRemotePrefill: true, RemoteEngineID: "p", RemoteHost: "10.0.0.1", RemotePort: 8001, RemoteBlockIDs: []int{3, 4}, RemoteRequestID: "r", TPSize: 1}
	if err != nil || !reflect.DeepEqual(p, want) {
		t.Fatalf("got %+v %v", p, err)
	}
	// vLLM's NixlConnector answers now: one list per KV-cache group, and
	// remote_num_tokens.
	nested := strings.Replace(full, `"remote_block_ids":[3,4]`, `"remote_block_ids":[ [3,4] ],"remote_num_tokens":20`, 1)
	want.RemoteNumTokens = 20
	if p, err := ParseKVTransferParams(json.RawMessage(nested)); err != nil || !reflect.DeepEqual(p, want) {
		t.Errorf("per-group block ids: got %+v %v", p, err)
	}
	if p, err := ParseKVTransferParams(json.RawMessage(leg1KVTransferParams)); err != nil || !p.DoRemoteDecode || p.DoRemotePrefill {
		t.Errorf("leg 1 params: %+v %v", p, err)
	}
	for _, raw := range []string{"", " null "} {
		if p, err := ParseKVTransferParams(json.RawMessage(raw)); p != nil || err != nil {
			t.Errorf("%q: %+v %v", raw, p, err)
		}
	}
	bad := []struct{ raw, msg string }{
		{`3`, "JSON object"},
		{`{"a":1} x`, "JSON object"},
		{`{"do_remote_decode":"yes"}`, "boolean"},
		{`{"do_remote_prefill":true,"do_remote_decode":true}`, "both"},
		{`{"do_remote_prefill":true}`, "missing remote_engine_id, remote_host, remote_port, remote_block_ids"},
		{`{"do_remote_prefill":true,"remote_engine_id":"","remote_host":"h","remote_port":1,"remote_block_ids":[]}`, "malformed remote_engine_id"},
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":65536,"remote_block_ids":[]}`, "malformed remote_port"},
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":1,"remote_block_ids":[2147483648]}`, "malformed remote_block_ids"},
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":1,"remote_block_ids":"x"}`, "malformed remote_block_ids"},
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":1,"remote_block_ids":[],"tp_size":0}`, "malformed tp_size"},
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":1,"remote_block_ids":[[1],[2]]}`, "malformed remote_block_ids"}, // two groups: this engine has one
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":1,"remote_block_ids":[[-1]]}`, "malformed remote_block_ids"},
		{`{"do_remote_prefill":true,"remote_engine_id":"p","remote_host":"h","remote_port":1,"remote_block_ids":[1],"remote_num_tokens":-1}`, "malformed remote_num_tokens"},
	}
	for _, b := range bad {
		_, err := ParseKVTransferParams(json.RawMessage(b.raw))
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Message, b.msg) {
			t.Errorf("%s: %v, want a 400 containing %q", b.raw, err, b.msg)
		}
	}
}

func TestPrefillDecodeBodies(t *testing.T) {
	client := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},` +
		`"max_tokens":50,"max_completion_tokens":40,"min_tokens":10,"temperature":0.2,` +
		`"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"evil","remote_host":"169.254.169.254","remote_port":80,"remote_block_ids":[]}}`
	r, err := ParseChat([]byte(client))
	if err != nil {
		t.Fatal(err)
	}
	leg1 := string(r.PrefillBody())
	wantLeg1 := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":1,"max_completion_tokens":1,"temperature":0.2,"kv_transfer_params":` + leg1KVTransferParams + `}`
	if leg1 != wantLeg1 {
		t.Errorf("leg 1:\n got %s\nwant %s", leg1, wantLeg1)
	}
	// Without max_tokens and max_completion_tokens: max_tokens is added,
	// max_completion_tokens is not.
	r2, _ := ParseCompletion([]byte(`{"prompt":"x"}`))
	if got := string(r2.PrefillBody()); got != `{"prompt":"x","stream":false,"max_tokens":1,"kv_transfer_params":`+leg1KVTransferParams+`}` {
		t.Errorf("leg 1 without limits: %s", got)
	}

	answer := `{"id":"cmpl-1","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p","remote_block_ids":[1,2],"remote_host":"10.0.0.2","remote_port":8100,"remote_request_id":"cmpl-1","tp_size":1}}`
	kv, err := ResponseKVTransferParams([]byte(answer))
	if err != nil || kv == nil {
		t.Fatalf("response params: %s %v", kv, err)
	}
	leg2, err := r.DecodeBody(kv)
	if err != nil {
		t.Fatal(err)
	}
	want2 := strings.Replace(client, client[strings.Index(client, `"kv_transfer_params":`):len(client)-1], `"kv_transfer_params":`+string(kv), 1)
	if string(leg2) != want2 {
		t.Errorf("leg 2:\n got %s\nwant %s", leg2, want2)
	}
	if _, err := r.DecodeBody(json.RawMessage(leg1KVTransferParams)); err == nil {
		t.Error("leg 2 accepted params that ask for a remote decode")
	}
	if kv, err := ResponseKVTransferParams([]byte(`{"id":"x","kv_transfer_params":null}`)); kv != nil || err != nil {
		t.Errorf("null params: %s %v", kv, err)
	}
	if _, err := ResponseKVTransferParams([]byte(`{"id":`)); err == nil {
		t.Error("invalid response accepted")
	}

	stripped, _ := ParseRequest(r.StripRoutingParams())
	if stripped.Has("kv_transfer_params") || !stripped.Stream || *stripped.MaxTokens != 50 {
		t.Errorf("stripped: %s", stripped.Raw)
	}
	plain, _ := ParseRequest([]byte(`{"prompt":"x"}`))
	if got := plain.StripRoutingParams(); &got[0] != &plain.Raw[0] {
		t.Error("strip copied a body without kv_transfer_params")
	}
}

// TestBootstrapBody: SGLang's P/D legs carry the gateway's bootstrap
// fields, never a client's; the room stays below 2^63 (SGLang keeps it as
// an int64); a client's own bootstrap fields are stripped from any body.
func TestBootstrapBody(t *testing.T) {
	client := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"bootstrap_host":"169.254.169.254","bootstrap_port":80,"bootstrap_room":1,"kv_transfer_params":{"do_remote_prefill":true}}`
	r, err := ParseChat([]byte(client))
	if err != nil {
		t.Fatal(err)
	}
	got := string(r.BootstrapBody("10.0.0.5", 8998, 1<<63|42))
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"bootstrap_host":"10.0.0.5","bootstrap_port":8998,"bootstrap_room":42}`
	if got != want {
		t.Errorf("both legs:\n got %s\nwant %s", got, want)
	}
	stripped := string(r.StripRoutingParams())
	if want := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`; stripped != want {
		t.Errorf("stripped:\n got %s\nwant %s", stripped, want)
	}
}

// TestCheckPrefillAnswer: a prefill engine's kv_transfer_params go into
// leg 2 as the engine wrote them, whatever its KV connector puts there,
// once they ask for a remote prefill.
func TestCheckPrefillAnswer(t *testing.T) {
	r, err := ParseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, params string
		ok           bool
	}{
		{"NixlConnector", `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p","remote_block_ids":[1,2],"remote_host":"10.0.0.2","remote_port":8100,"remote_request_id":"cmpl-1","tp_size":1}`, true},
		// Captured from llm-d-inference-sim (2026-12-02): placeholder
		// strings for block ids, no remote_request_id.
		{"llm-d-inference-sim", `{"do_remote_decode":false,"do_remote_prefill":true,"remote_engine_id":"DUMMY_ID","remote_block_ids":["DUMMY_ID"],"remote_host":"DUMMY","remote_port":1234,"tp_size":1}`, true},
		{"a connector's own field", `{"do_remote_prefill":true,"remote_engine_id":"p","remote_block_ids":[7],"remote_host":"h","remote_port":1,"remote_handshake_port":6000}`, true},
		{"the flag alone", `{"do_remote_prefill":true}`, true},
		{"do_remote_decode null", ` {"do_remote_prefill":true,"do_remote_decode":null} `, true},
		{"leg 1's params", leg1KVTransferParams, false},
		{"both flags", `{"do_remote_prefill":true,"do_remote_decode":true}`, false},
		{"no flag", `{"remote_host":"h"}`, false},
		{"flag false", `{"do_remote_prefill":false}`, false},
		{"flag not a boolean", `{"do_remote_prefill":"true"}`, false},
		{"do_remote_decode not a boolean", `{"do_remote_prefill":true,"do_remote_decode":1}`, false},
		{"an array", `[{"do_remote_prefill":true}]`, false},
		{"null", `null`, false},
		{"empty", ``, false},
		{"invalid JSON", `{"do_remote_prefill":true`, false},
		{"trailing bytes", `{"do_remote_prefill":true} x`, false},
	} {
		err := CheckPrefillAnswer(json.RawMessage(tt.params))
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v, want ok=%v", tt.name, err, tt.ok)
			continue
		}
		if !tt.ok {
			continue
		}
		leg2, err := r.DecodeBody(json.RawMessage(tt.params))
		if want := strings.TrimSpace(tt.params); err != nil || !strings.Contains(string(leg2), `"kv_transfer_params":`+want) {
			t.Errorf("%s: leg 2 %s %v, want the params verbatim", tt.name, leg2, err)
		}
	}
}

func TestWriteError(t *testing.T) {
	tests := []struct {
		err    error
		status int
		typ    string
		retry  string
		param  bool
	}{
		{BadRequest("bad %d", 1).WithParam("prompt"), 400, "BadRequestError", "", true},
		{NotFound("no"), 404, "NotFoundError", "", false},
		{TooLarge(10), 413, "RequestTooLargeError", "", false},
		{&http.MaxBytesError{Limit: 7}, 413, "RequestTooLargeError", "", false},
		{TooManyRequests(1500*time.Millisecond, "slow down"), 429, "RateLimitError", "2", false},
		{Unavailable(time.Second, "busy"), 503, "ServiceUnavailableError", "1", false},
		{Unavailable(0, "busy"), 503, "ServiceUnavailableError", "", false},
		{Internal("oops"), 500, "InternalServerError", "", false},
		{errors.New("plain"), 500, "InternalServerError", "", false},
		{Errorf(409, "conflict"), 409, "ConflictError", "", false},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		WriteError(w, tt.err)
		var body ErrorBody
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if w.Code != tt.status || body.Error.Code != tt.status || body.Error.Type != tt.typ ||
			w.Header().Get("Retry-After") != tt.retry || (body.Error.Param != nil) != tt.param ||
			w.Header().Get("Content-Type") != "application/json" || body.Error.Message == "" {
			t.Errorf("%v: %d %s %+v retry %q", tt.err, w.Code, w.Body, body.Error, w.Header().Get("Retry-After"))
		}
	}
	var raw map[string]map[string]any
	w := httptest.NewRecorder()
	WriteError(w, NotFound("x"))
	json.Unmarshal(w.Body.Bytes(), &raw)
	if v, ok := raw["error"]["param"]; !ok || v != nil {
		t.Errorf("param must be present and null: %s", w.Body)
	}
}

func TestResponseCachedTokens(t *testing.T) {
	tests := []struct {
		body string
		n    int
		ok   bool
	}{
		{`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":7}}}`, 7, true},
		{`{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`, 0, true},
		{`{"usage":{"prompt_tokens":10,"prompt_tokens_details":null}}`, 0, false}, // vLLM without --enable-prompt-tokens-details
		{`{"usage":{"prompt_tokens":10}}`, 0, false},
		{`{"choices":[]}`, 0, false},
		{`{"usage":{"prompt_tokens_details":{"cached_tokens":-3}}}`, 0, false},
		{`{"usage":{"prompt_tokens_details":{"cached_tokens":"7"}}}`, 0, false},
		{`not json`, 0, false},
		{``, 0, false},
	}
	for _, tc := range tests {
		n, ok := ResponseCachedTokens([]byte(tc.body))
		if n != tc.n || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.body, n, ok, tc.n, tc.ok)
		}
	}
}

// TestVLLMLegsStripBootstrap: a client's SGLang bootstrap members never
// reach either leg of vLLM's P/D flow.
func TestVLLMLegsStripBootstrap(t *testing.T) {
	r, err := ParseRequest([]byte(`{"model":"m","prompt":"x","max_tokens":2,"bootstrap_host":"10.9.9.9","bootstrap_port":1,"bootstrap_room":7}`))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := r.DecodeBody(json.RawMessage(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p"}`))
	if err != nil {
		t.Fatal(err)
	}
	for leg, body := range map[string][]byte{"prefill": r.PrefillBody(), "decode": dec} {
		if strings.Contains(string(body), "bootstrap") || !strings.Contains(string(body), `"kv_transfer_params"`) {
			t.Errorf("%s leg: %s", leg, body)
		}
	}
}

// TestResponseEndedAtFirstToken: a prefill answer ended for a reason of
// its own only when every choice finished and none for its length.
func TestResponseEndedAtFirstToken(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"choices":[{"text":"","finish_reason":"stop"}]}`, true},
		{`{"choices":[{"message":{"content":""},"finish_reason":"stop","stop_reason":"\n"}]}`, true},
		{`{"choices":[{"finish_reason":"stop"},{"finish_reason":"stop"}]}`, true},
		{`{"choices":[{"finish_reason":"length"}]}`, false},
		{`{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}`, false},
		{`{"choices":[{"finish_reason":null}]}`, false},
		{`{"choices":[{"finish_reason":""}]}`, false},
		{`{"choices":[{}]}`, false},
		{`{"choices":[]}`, false},
		{`{}`, false},
		{`not json`, false},
		{`{"choices":[{"finish_reason":7}]}`, false},
	} {
		if got := ResponseEndedAtFirstToken([]byte(c.body)); got != c.want {
			t.Errorf("%s: %v, want %v", c.body, got, c.want)
		}
	}
}
