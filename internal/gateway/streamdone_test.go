package gateway

// Regression test: a streamed answer the client has whole (its [DONE]
// line) is ok however soon the client hangs up.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// lockstep paces a fake engine's stream by its client: the engine sends
// its next chunk only once the client has read the previous one, so the
// gateway reads every chunk on its own (the stream's TPOT is observed) and
// each stream ends exactly as the test says.
type lockstep struct {
	mu      sync.Mutex
	streams map[string]*pacedStream // by X-Request-Id
}

type pacedStream struct {
	ack chan struct{}
	// linger: after [DONE] the engine keeps the response open until the
	// gateway goes away, so a client that leaves right after [DONE]
	// always does so before the gateway sees the upstream body end.
	linger bool
}

func (l *lockstep) open(id string, linger bool) *pacedStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &pacedStream{ack: make(chan struct{}, 1), linger: linger}
	l.streams[id] = s
	return s
}

func (l *lockstep) get(id string) *pacedStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streams[id]
}

const pacedChunks = 4

// server is the paced engine.
func (l *lockstep) server(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		ps := l.get(r.Header.Get("X-Request-Id"))
		if ps == nil {
			http.Error(w, "unknown stream", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		wait := func(c <-chan struct{}) bool {
			select {
			case <-c:
				return true
			case <-r.Context().Done():
			case <-time.After(20 * time.Second): // never outlive the test
			}
			return false
		}
		for i := range pacedChunks {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\"}]}\n\n", i)
			f.Flush()
			if !wait(ps.ack) {
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		f.Flush()
		if ps.linger {
			wait(nil)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// streamAndLeave streams one completion through the gateway and hangs up
// right after reading the [DONE] line or, when leaveAfter > 0, after
// reading that many chunks.
func (l *lockstep) streamAndLeave(t *testing.T, url, id string, linger bool, leaveAfter int) {
	t.Helper()
	ps := l.open(id, linger)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completion("hi", true, 8)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d", id, resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for chunks := 0; ; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: the stream ended before [DONE]: %v", id, err)
		}
		line = strings.TrimSpace(line)
		if line == "data: [DONE]" {
			return // hang up at once (cancel, then Close)
		}
		if strings.HasPrefix(line, "data: ") {
			if chunks++; chunks == leaveAfter {
				return
			}
			ps.ack <- struct{}{}
		}
	}
}

// TestStreamCompleteAtDone: a streamed answer whose [DONE] the client
// got is ok, and trains the TPOT model, however soon after [DONE] the
// client hangs up; only a client that leaves before [DONE] is
// client_gone. (Before, a client that hung up before the gateway saw the
// upstream body end was client_gone and its TPOT was lost: always so
// against an engine that lingers after [DONE], about 10 in 600 against
// one that ends at once.)
func TestStreamCompleteAtDone(t *testing.T) {
	for _, tc := range []struct {
		name       string
		n          int
		linger     bool
		leaveAfter int
		outcome    string
	}{
		{"engine lingers after DONE", 50, true, 0, "ok"},
		{"engine ends at DONE", 50, false, 0, "ok"},
		{"client leaves mid-stream", 5, false, 2, "client_gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lockstep{streams: map[string]*pacedStream{}}
			up := l.server(t)
			g, url, admin := startGateway(t, Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}}}, Options{})
			for i := range tc.n {
				l.streamAndLeave(t, url, fmt.Sprintf("s%d", i), tc.linger, tc.leaveAfter)
			}
			total := func() int {
				n := 0
				for _, v := range outcomes(t, g) {
					n += v
				}
				return n
			}
			waitFor(t, func() bool { return total() >= tc.n })
			if got, want := outcomes(t, g), map[string]int{tc.outcome: tc.n}; !maps.Equal(got, want) {
				t.Errorf("counted %v, want %v", got, want)
			}
			// Finished is called before the outcome is counted.
			samples := 0
			if eps := adminEndpoints(t, admin); len(eps) == 1 && eps[0].DecodePredictor != nil {
				samples = eps[0].DecodePredictor.Samples
			}
			wantSamples := 0
			if tc.outcome == "ok" {
				wantSamples = tc.n
			}
			if samples != wantSamples {
				t.Errorf("TPOT model samples %d, want %d", samples, wantSamples)
			}
			waitFor(t, func() bool { return g.inflight.Load() == 0 })
		})
	}
}

// TestStreamEnd: the [DONE] line ends a stream however the upstream's
// reads cut it, and only a whole line of its own does; the data lines
// before it that bring tokens are counted, however many a read brings.
func TestStreamEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pieces []string
		done   bool
		events int // data lines before [DONE] that bring tokens
	}{
		{"one read", []string{"data: {\"text\":\"a\"}\n\ndata: [DONE]\n\n"}, true, 1},
		{"own read", []string{"data: {\"text\":\"a\"}\n\n", "data: [DONE]\n\n"}, true, 1},
		{"cut in the line", []string{"data: {\"text\":\"a\"}\n\ndata: [DO", "NE]", "\n\n"}, true, 1},
		{"CRLF", []string{"data: {\"text\":\"a\"}\r\n\r\ndata: [DONE]\r\n\r\n"}, true, 1},
		{"no space", []string{"data:[DONE]\n\n"}, true, 0},
		{"line break not yet read", []string{"data: {\"text\":\"a\"}\n\ndata: [DONE]"}, false, 1},
		{"in a chunk's text", []string{`data: {"text":"data: [DONE]\n"}` + "\n\n"}, false, 1},
		{"longer line", []string{"data: [DONE]]\n", "xdata: [DONE]\n", "data: {\"text\":\"a\"}\n"}, false, 1},
		{"not yet", []string{"data: {\"text\":\"a\"}\n\n"}, false, 1},
		{"line cut long", []string{"data: [DONE", "E]\n"}, false, 0},
		{"events cut across reads, comments", []string{"da", "ta: {\"text\":\"a\"}\n\nda", "ta: {\"te", "xt\":\"a\"}\n\n: ping\n\ndata:{\"text\":\"a\"}\n", "\ndata: [DONE]\n\n"}, true, 3},
		{"several events a read", []string{"data: {\"text\":\"a\"}\n\ndata: {\"text\":\"a\"}\n\ndata: {\"text\":\"a\"}\n\n", "data: {\"text\":\"a\"}\n\ndata: [DONE]\n\n"}, true, 4},
		// vLLM's chat stream: the role event, two tokens, a finish
		// reason alone, the usage event (stream_options.include_usage).
		{"chat: role, finish and usage events bring no token", []string{
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there"},"logprobs":null,"finish_reason":null}]}` + "\n\n",
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n",
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}` + "\n\n",
			"data: [DONE]\n\n",
		}, true, 2},
		{"completions: an empty text with spaces", []string{`data: {"choices": [{"text": "a"}]}` + "\n\n" + `data: {"choices": [{"text": "", "finish_reason": "length"}]}` + "\n\n" + `data: {"choices": [], "usage": {}}` + "\n\ndata: [DONE]\n\n"}, true, 1},
		{"an empty field cut across reads", []string{`data: {"choices":[{"delta":{"role":"assistant","cont`, `ent":""}}]}` + "\n", `data: {"choices":[{"delta":{"content":"x"}}]}` + "\n"}, false, 1},
		{"a line longer than kept brings text", []string{"data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", sseLineCap) + "\"}],\"content\":\"\"}\n"}, false, 1},
		{"an empty reasoning field and a text", []string{`data: {"choices":[{"delta":{"reasoning_content":"","content":"x"}}]}` + "\n"}, false, 1},
		// llm-d-inference-sim: the role event has no content at all, a
		// finish reason alone an empty delta.
		{"chat without empty contents", []string{
			`data: {"id":"chatcmpl-2","created":1,"model":"m","object":"chat.completion.chunk","choices":[{"index":0,"finish_reason":null,"delta":{"role":"assistant"}}]}` + "\n\n" +
				`data: {"id":"chatcmpl-2","created":1,"model":"m","object":"chat.completion.chunk","choices":[{"index":0,"finish_reason":null,"delta":{"content":"Today"}}]}` + "\n\n" +
				`data: {"id":"chatcmpl-2","created":1,"model":"m","object":"chat.completion.chunk","choices":[{"index":0,"finish_reason":"stop","delta":{}}]}` + "\n\n" +
				`data: {"id":"chatcmpl-2","created":1,"model":"m","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\ndata: [DONE]\n\n",
		}, true, 1},
		{"reasoning, tool call arguments, a null content", []string{
			`data: {"choices":[{"delta":{"reasoning_content":"Let"}}]}` + "\n\n",
			`data: {"choices":[{"delta":{"reasoning":" me"}}]}` + "\n\n",
			`data: {"choices":[{"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{\"city"}}]}}]}` + "\n\n",
			`data: {"choices":[{"delta":{"content":null},"logprobs":{"content":[{"token":"x","logprob":-1}]}}]}` + "\n\n",
		}, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &streamEnd{}
			for _, p := range tc.pieces {
				s.scan([]byte(p))
			}
			if s.done() != tc.done || s.events != tc.events {
				t.Errorf("done %v with %d events, want %v with %d", s.done(), s.events, tc.done, tc.events)
			}
		})
	}
	var none *streamEnd // not a stream
	none.scan([]byte("data: [DONE]\n"))
	if none.done() {
		t.Error("a non-stream ended at [DONE]")
	}
}

// BenchmarkStreamEndScan: the relay's per-event cost of finding the end
// of a vLLM chat stream (500 token events, the role and usage events) and
// classifying its events, in reads of 16 events, against finding its
// line breaks alone in the same run (the floor of any scan).
// chatStreamEvents is a vLLM chat stream of n tokens, event by event:
// the role event, n content events, the usage event and [DONE].
func chatStreamEvents(n int) []string {
	const head = `data: {"id":"chatcmpl-0123456789abcdef0123456789abcdef","object":"chat.completion.chunk","created":1764000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":`
	var events []string
	events = append(events, head+`{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n")
	for i := range n {
		events = append(events, fmt.Sprintf(head+`{"content":" word%d"},"logprobs":null,"finish_reason":null}]}`+"\n\n", i))
	}
	return append(events, fmt.Sprintf(`data: {"id":"chatcmpl-0123456789abcdef0123456789abcdef","object":"chat.completion.chunk","created":1764000000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 5+n, n), "data: [DONE]\n\n")
}

func BenchmarkStreamEndScan(b *testing.B) {
	events := chatStreamEvents(500)
	var reads [][]byte
	for i := 0; i < len(events); i += 16 {
		reads = append(reads, []byte(strings.Join(events[i:min(i+16, len(events))], "")))
	}
	b.Run("line-breaks", func(b *testing.B) {
		for range b.N {
			n := 0
			for _, r := range reads {
				n += bytes.Count(r, []byte("\n"))
			}
			if n != 2*len(events) {
				b.Fatal(n)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
	})
	b.Run("streamEnd", func(b *testing.B) {
		for range b.N {
			s := streamEnd{}
			for _, r := range reads {
				s.scan(r)
			}
			if !s.done() || s.events != 500 {
				b.Fatal(s.events)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
	})
}
