package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// sglangPair stands for an SGLang prefill and decode engine pair: each
// records the bodies it was sent; the prefill answers after a short
// prefill with what prefillStatus says, the decode answers (streamed or
// not) unless decodeWaits, in which case it waits until its request is
// called off and counts it.
type sglangPair struct {
	mu             sync.Mutex
	prefill, dec   []map[string]any
	prefillStatus  atomic.Int32
	decodeWaits    atomic.Bool
	decodeCanceled atomic.Int32
}

func (s *sglangPair) record(dst *[]map[string]any, r *http.Request) map[string]any {
	var body map[string]any
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	s.mu.Lock()
	*dst = append(*dst, body)
	s.mu.Unlock()
	return body
}

// sent reports whether a body of list (the prefill's or the decode's)
// carried room.
func (s *sglangPair) sent(list *[]map[string]any, room any) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range *list {
		if b["bootstrap_room"] == room {
			return true
		}
	}
	return false
}

func (s *sglangPair) servers(t *testing.T) (prefillURL, decodeURL string) {
	pre := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := s.record(&s.prefill, r)
		time.Sleep(10 * time.Millisecond)
		if st := int(s.prefillStatus.Load()); st != 0 && st != 200 {
			// Fail only once the decode leg is there, waiting.
			for deadline := time.Now().Add(5 * time.Second); !s.sent(&s.dec, body["bootstrap_room"]) && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			http.Error(w, `{"error":{"message":"prompt too long for the prefill"}}`, st)
			return
		}
		fmt.Fprint(w, `{"id":"p","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	dec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := s.record(&s.dec, r)
		if s.decodeWaits.Load() {
			select {
			case <-r.Context().Done():
				s.decodeCanceled.Add(1)
			case <-time.After(10 * time.Second):
			}
			return
		}
		// As SGLang's decode engine, answer only once the prefill engine
		// has the room (the KV comes from there).
		for deadline := time.Now().Add(5 * time.Second); !s.sent(&s.prefill, body["bootstrap_room"]); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				http.Error(w, "no prefill for this room", http.StatusGatewayTimeout)
				return
			}
		}
		if stream, _ := body["stream"].(bool); stream {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, tok := range []string{"de", "code"} {
				fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":%q}]}\n\n", tok)
				w.(http.Flusher).Flush()
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		fmt.Fprint(w, `{"id":"d","object":"text_completion","choices":[{"index":0,"text":"decoded","finish_reason":"length"}]}`)
	}))
	t.Cleanup(pre.Close)
	t.Cleanup(dec.Close)
	return pre.URL, dec.URL
}

// TestSGLangDisaggregation: a prefill endpoint with a bootstrap port runs
// SGLang's P/D protocol: the same body, with bootstrap_host (the prefill
// engine's host), bootstrap_port and one bootstrap_room below 2^63, goes to
// both engines, a client's own bootstrap fields and kv_transfer_params
// never; the client gets the decode engine's answer, streamed or not. A
// prefill that fails calls the waiting decode leg off and the client hears
// the prefill's answer.
func TestSGLangDisaggregation(t *testing.T) {
	pair := &sglangPair{}
	pu, du := pair.servers(t)
	cfg := Config{Endpoints: []fleet.Endpoint{
		{Name: "p", URL: pu, Model: testModel, Role: fleet.RolePrefill, BootstrapPort: 8998},
		{Name: "d", URL: du, Model: testModel, Role: fleet.RoleDecode},
	}}
	_, url, _ := startGateway(t, cfg, Options{})
	evil := `,"bootstrap_host":"169.254.169.254","bootstrap_port":80,"bootstrap_room":7,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254"}}`
	for _, stream := range []bool{false, true} {
		c := completion("hello there", stream, 4)
		r := post(t, url+"/v1/completions", c[:len(c)-1]+evil, nil)
		if r.status != 200 || r.header.Get(hdrPrefill) != "p" || r.header.Get(hdrDecode) != "d" {
			t.Fatalf("stream=%v: %d %v %s", stream, r.status, r.header, r.body)
		}
		// Unstreamed, the decode leg goes as a stream (the client's
		// routing members, stripped, no longer keep it as sent) and its
		// events make the answer.
		if want := map[bool]string{false: `"text":"decode"`, true: "[DONE]"}[stream]; !strings.Contains(r.body, want) {
			t.Fatalf("stream=%v: the client got %s, not the decode engine's answer", stream, r.body)
		}
		pair.mu.Lock()
		pb, db := pair.prefill[len(pair.prefill)-1], pair.dec[len(pair.dec)-1]
		pair.mu.Unlock()
		room, _ := pb["bootstrap_room"].(float64)
		if pb["bootstrap_host"] != "127.0.0.1" || pb["bootstrap_port"] != float64(8998) || room == 7 || room >= math.Exp2(63) {
			t.Errorf("stream=%v: bootstrap fields %v %v %v", stream, pb["bootstrap_host"], pb["bootstrap_port"], pb["bootstrap_room"])
		}
		if _, ok := pb["kv_transfer_params"]; ok {
			t.Errorf("stream=%v: client kv_transfer_params reached the prefill engine", stream)
		}
		pj, _ := json.Marshal(pb)
		dj, _ := json.Marshal(db)
		if string(pj) != string(dj) {
			t.Errorf("stream=%v: the legs differ:\n prefill %s\n decode  %s", stream, pj, dj)
		}
	}
	pair.prefillStatus.Store(500)
	pair.decodeWaits.Store(true)
	r := post(t, url+"/v1/completions", completion("hello again", true, 4), nil)
	if r.status != http.StatusInternalServerError || !strings.Contains(r.body, "endpoint p: ") || !strings.Contains(r.body, "prefill") {
		t.Fatalf("failed prefill: %d %s, want the prefill engine's 500", r.status, r.body)
	}
	waitFor(t, func() bool { return pair.decodeCanceled.Load() == 1 })
	pair.prefillStatus.Store(400)
	r = post(t, url+"/v1/completions", completion("hello once more", false, 4), nil)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "prompt too long for the prefill") {
		t.Fatalf("refused prefill: %d %s", r.status, r.body)
	}
	waitFor(t, func() bool { return pair.decodeCanceled.Load() == 2 })
}

// TestBootstrapFieldsStripped: a client's bootstrap fields never reach an
// engine outside SGLang's P/D flow either (an SGLang decode engine would
// connect where they point).
func TestBootstrapFieldsStripped(t *testing.T) {
	c := &capture{}
	up := c.server(t)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}}}
	_, url, _ := startGateway(t, cfg, Options{})
	body := `{"model":"` + testModel + `","prompt":"hi","max_tokens":2,"bootstrap_host":"169.254.169.254","bootstrap_port":80,"bootstrap_room":1}`
	if r := post(t, url+"/v1/completions", body, nil); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	c.mu.Lock()
	sent := c.bodies[0]
	c.mu.Unlock()
	if strings.Contains(sent, "bootstrap") {
		t.Fatalf("client bootstrap fields reached the engine: %s", sent)
	}
}

// TestBootstrapRoomNamesTheRank: SGLang finds a prefill's data-parallel
// rank from its room (room mod ranks), so the room of a request pinned to
// rank R of an engine of N ranks is R mod N, and always below 2^63.
func TestBootstrapRoomNamesTheRank(t *testing.T) {
	eps, err := fleet.Validate([]fleet.Endpoint{{Name: "p", URL: "http://h:1", Model: "m", Role: fleet.RolePrefill, DPSize: 3, BootstrapPort: 8998}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []uint64{0, 1, 2, 41, math.MaxUint64, math.MaxInt64, math.MaxInt64 - 1} {
		for _, ep := range eps {
			room := bootstrapRoom(r, ep)
			if room > math.MaxInt64 || room%3 != uint64(ep.DPRank) {
				t.Errorf("random %d, rank %d: room %d", r, ep.DPRank, room)
			}
		}
		if room := bootstrapRoom(r, fleet.Endpoint{}); room > math.MaxInt64 || room != r&math.MaxInt64 {
			t.Errorf("random %d, no ranks: room %d", r, room)
		}
	}
}

// TestSGLangBatchBootstrap: a batch goes to SGLang's P/D flow with its
// bootstrap fields as lists, one element a prompt and a room each, as
// SGLang's router sends them (its Rust router for a completion's prompt
// list and a chat's n, mini_lb for /generate's lists); a single prompt
// keeps scalars. Each room names the prefill's rank.
func TestSGLangBatchBootstrap(t *testing.T) {
	var mu sync.Mutex
	var bodies []map[string]any // the prefill leg's, then the decode leg's
	prefilled := make(chan struct{}, 1)
	leg := func(decode bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var body map[string]any
			b, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(b, &body)
			if decode {
				// As SGLang's decode engine: its answer waits for the
				// prefill (the KV comes from there).
				select {
				case <-prefilled:
				case <-time.After(5 * time.Second):
				}
			}
			mu.Lock()
			bodies = append(bodies, body)
			mu.Unlock()
			if !decode {
				prefilled <- struct{}{}
			}
			fmt.Fprint(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}`)
		}
	}
	pre, dec := httptest.NewServer(leg(false)), httptest.NewServer(leg(true))
	t.Cleanup(pre.Close)
	t.Cleanup(dec.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{
		{Name: "p", URL: pre.URL, Model: testModel, Role: fleet.RolePrefill, BootstrapPort: 8998},
		{Name: "d", URL: dec.URL, Model: testModel, Role: fleet.RoleDecode},
	}}
	_, url, _ := startGateway(t, cfg, Options{})
	for _, c := range []struct {
		path, body string
		n          int // 0: scalars
	}{
		{"/v1/completions", `{"model":"` + testModel + `","prompt":"one prompt","max_tokens":2}`, 0},
		{"/v1/completions", `{"model":"` + testModel + `","prompt":["first prompt","second prompt"],"max_tokens":2}`, 2},
		{"/v1/completions", `{"model":"` + testModel + `","prompt":[[1,2,3],[4,5,6],[7,8,9]],"max_tokens":2}`, 3},
		{"/v1/completions", `{"model":"` + testModel + `","prompt":[1,2,3],"max_tokens":2}`, 0},
		{"/v1/chat/completions", `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"n":3,"max_tokens":2}`, 3},
		{"/v1/chat/completions", `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"n":1,"max_tokens":2}`, 0},
		{"/generate", `{"model":"` + testModel + `","input_ids":[[1,2],[3,4]],"sampling_params":{"max_new_tokens":2}}`, 2},
		{"/generate", `{"model":"` + testModel + `","text":["a","b","c","d"],"sampling_params":{"max_new_tokens":2}}`, 4},
		{"/generate", `{"model":"` + testModel + `","text":"a","sampling_params":{"max_new_tokens":2}}`, 0},
	} {
		mu.Lock()
		bodies = bodies[:0]
		mu.Unlock()
		if r := post(t, url+c.path, c.body, nil); r.status != 200 {
			t.Fatalf("%s %s: %d %s", c.path, c.body, r.status, r.body)
		}
		mu.Lock()
		got := append([]map[string]any(nil), bodies...)
		mu.Unlock()
		if len(got) != 2 {
			t.Fatalf("%s: %d legs", c.body, len(got))
		}
		b := got[0]
		if c.n == 0 {
			if _, ok := b["bootstrap_room"].(float64); !ok || b["bootstrap_host"] != "127.0.0.1" || b["bootstrap_port"] != float64(8998) {
				t.Errorf("%s: want scalar fields, got %v %v %v", c.body, b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"])
			}
			continue
		}
		hosts, _ := b["bootstrap_host"].([]any)
		ports, _ := b["bootstrap_port"].([]any)
		rooms, _ := b["bootstrap_room"].([]any)
		if len(hosts) != c.n || len(ports) != c.n || len(rooms) != c.n {
			t.Errorf("%s: want lists of %d, got %v %v %v", c.body, c.n, b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"])
			continue
		}
		seen := map[float64]bool{}
		for i := range c.n {
			room, _ := rooms[i].(float64)
			if hosts[i] != "127.0.0.1" || ports[i] != float64(8998) || room >= math.Exp2(63) || seen[room] {
				t.Errorf("%s: element %d: %v %v %v", c.body, i, hosts[i], ports[i], rooms[i])
			}
			seen[room] = true
		}
		pj, _ := json.Marshal(got[0])
		dj, _ := json.Marshal(got[1])
		if string(pj) != string(dj) {
			t.Errorf("%s: the legs differ:\n %s\n %s", c.body, pj, dj)
		}
	}
	// A batch on a rank of a data-parallel prefill engine: every room
	// names that rank.
	eps, err := fleet.Validate([]fleet.Endpoint{{Name: "p", URL: "http://h:1", Model: "m", Role: fleet.RolePrefill, DPSize: 4, BootstrapPort: 8998}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		var b struct {
			Rooms []uint64 `json:"bootstrap_room"`
		}
		req, err := openai.ParseRequest([]byte(`{"model":"m","prompt":["a","b","c","d","e"]}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(bootstrapBody(&routed{req: req, batch: 5}, ep), &b); err != nil || len(b.Rooms) != 5 {
			t.Fatalf("rank %d: %v %v", ep.DPRank, b.Rooms, err)
		}
		for _, room := range b.Rooms {
			if room > math.MaxInt64 || room%4 != uint64(ep.DPRank) {
				t.Errorf("rank %d: room %d", ep.DPRank, room)
			}
		}
	}
}

// TestBootstrapHost: bootstrap_host is the prefill URL's host; an IPv6
// address keeps its brackets (SGLang's decode engine joins host:port).
func TestBootstrapHost(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"http://10.0.0.5:30000", "10.0.0.5"},
		{"http://prefill-0.svc.cluster.local:30000", "prefill-0.svc.cluster.local"},
		{"http://[::1]:30000", "[::1]"},
		{"http://[fd00::5]:30000/v1", "[fd00::5]"},
		{"http://[fe80::1%25eth0]:30000", "[fe80::1%eth0]"},
		{"::not a url", ""},
	} {
		if got := hostOf(c.url); got != c.want {
			t.Errorf("%s: %q, want %q", c.url, got, c.want)
		}
	}
}
