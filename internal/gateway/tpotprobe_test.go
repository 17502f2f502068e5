package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
)

// TestTPOTProbeTrainsMidStream: a stream's event load.TPOTProbeTokens past
// its first trains its endpoint's TPOT model while the stream still runs,
// and the stream's end does not train it again. The upstream sends each
// event only once the client has the one before, so the probe comes
// before the stream's end however the machine schedules it.
func TestTPOTProbeTrainsMidStream(t *testing.T) {
	const chunks = load.TPOTProbeTokens + 8
	ack := make(chan struct{}, 1)
	sent, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for range chunks {
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-ack:
			case <-time.After(10 * time.Second):
				return
			}
		}
		close(sent)
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}}}
	_, url, admin := startGateway(t, cfg, Options{})
	samples := func() int {
		d := adminEndpoints(t, admin)[0].DecodePredictor
		if d == nil {
			t.Fatal("no decode predictor state: the learned predictor is the default")
		}
		return d.Samples
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(tokenPrompt(8, 10, true)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan int)
	go func() {
		n := 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: {") {
				n++
				ack <- struct{}{}
			}
		}
		done <- n
	}()
	select {
	case <-sent:
	case <-ctx.Done():
		t.Fatal("the stream stalled")
	}
	if got := samples(); got != 1 {
		t.Fatalf("%d TPOT samples with the stream %d chunks in and still open, want 1", got, chunks)
	}
	close(release)
	if n := <-done; n != chunks {
		t.Fatalf("client read %d chunks, want %d", n, chunks)
	}
	// The end's Finished runs after the last byte; it ends the flight.
	waitFor(t, func() bool { return adminEndpoints(t, admin)[0].Load.InflightRequests == 0 })
	if got := samples(); got != 1 {
		t.Fatalf("%d TPOT samples after the stream ended, want 1: its end trained again", got)
	}
}

// TestTPOTCountsEvents: an engine whose writes each bring two tokens
// (two SSE events) is measured per token: the observed TPOT is the time
// from the first event to the last over the events less one, not over
// the reads, which would double it. The gateway's clock moves 10 ms
// between writes, and only once the client has the write before, so the
// times the gateway reads are exact: 21 writes, 42 events, 200 ms. A
// request sampling n sequences (OpenAI's n) has their events interleaved,
// one choice an event, as vLLM streams them: its TPOT is per sequence,
// the same, where counted over all events it read n times low; and so
// are a batch's prompts' n sequences each.
//
// An engine that sends several tokens an event (per: vLLM's
// --stream-interval) and reports the usage in every event, as the
// gateway asks it to, has its tokens counted by that usage: 3 tokens an
// event, the TPOT a third of what the events say.
//
// SGLang's /generate counts its tokens in every event (meta_info's
// completion_tokens), which the gateway reads the same way.
func TestTPOTCountsEvents(t *testing.T) {
	for _, tc := range []struct {
		n, prompts, per int
		generate        bool
	}{{1, 1, 1, false}, {3, 1, 1, false}, {2, 2, 1, false}, {1, 1, 3, false}, {3, 1, 3, false}, {2, 2, 3, false}, {1, 1, 1, true}, {1, 1, 3, true}} {
		seqs := tc.n * tc.prompts
		t.Run(fmt.Sprintf("n=%d,prompts=%d,per=%d,generate=%v", tc.n, tc.prompts, tc.per, tc.generate), func(t *testing.T) {
			const writes = 21
			got, output := streamTPOT(t, writes, tc.n, tc.prompts, tc.per, tc.generate)
			tokens := 2 * writes * tc.per // a sequence's
			if output != tokens*seqs {
				t.Errorf("the planner heard of %d output tokens, want %d (every sequence's)", output, tokens*seqs)
			}
			want := 0.2 / float64(tokens-1)
			if math.Abs(got-want) > 1e-9 {
				t.Fatalf("observed TPOT %.6f s, want %.6f s (%d tokens a sequence in 200 ms); counted per read it is %.6f s, over all sequences' events %.6f s, per event %.6f s",
					got, want, tokens, 0.2/(writes-1), 0.2/float64(2*writes*seqs-1), 0.2/(2*writes-1))
			}
		})
	}
}

// streamTPOT is the TPOT the gateway observes of a completion of a batch
// of prompts, each sampling n sequences, whose upstream writes, writes
// times, two events for each sequence of per tokens each (with the
// usage so far when asked for it), its clock moved 10 ms between writes
// once the client has the one before; with generate, SGLang's /generate
// (one prompt, one sequence: the text so far and its count an event).
// It returns the TPOT and the output tokens the gateway's Traffic heard.
func streamTPOT(t *testing.T, writes, n, prompts, per int, generate bool) (float64, int) {
	seqs := n * prompts
	clock := &atomic.Int64{}
	clock.Store(time.Unix(1000, 0).UnixNano())
	ack := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			StreamOptions map[string]bool `json:"stream_options"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		continuous := body.StreamOptions["include_usage"] && body.StreamOptions["continuous_usage_stats"]
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		text := strings.TrimSpace(strings.Repeat("a ", per))
		sent := 0
		for i := range writes {
			if i > 0 {
				select {
				case <-ack: // the client has the write before
				case <-time.After(10 * time.Second):
					return
				}
				clock.Add(int64(10 * time.Millisecond))
			}
			for range 2 {
				sent += per
				if generate {
					sofar := strings.TrimSpace(strings.Repeat("a ", sent))
					fmt.Fprintf(w, "data: {\"text\":%q,\"meta_info\":{\"id\":\"x\",\"prompt_tokens\":8,\"completion_tokens\":%d}}\n\n", sofar, sent)
					continue
				}
				for c := range seqs {
					usage := ""
					if continuous {
						usage = fmt.Sprintf(`,"usage":{"prompt_tokens":8,"total_tokens":%d,"completion_tokens":%d}`, 8+sent, sent)
					}
					fmt.Fprintf(w, "data: {\"choices\":[{\"index\":%d,\"text\":%q}]%s}\n\n", c, text, usage)
				}
			}
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}}}
	tr := &answers{}
	_, url, admin := startGateway(t, cfg, Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }, Traffic: tr})
	lists := make([]string, prompts)
	for i := range lists {
		lists[i] = fmt.Sprintf("[%d,%d,%d]", 8+i, 8+i, 8+i)
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":2,"n":%d,"stream":true}`, testModel, strings.Join(lists, ","), n)
	if prompts == 1 {
		body = strings.Replace(tokenPrompt(8, 10, true), `"stream"`, fmt.Sprintf(`"n":%d,"stream"`, n), 1)
	}
	path := "/v1/completions"
	if generate {
		path, body = "/generate", `{"input_ids":[8,8,8,8,8,8,8,8,8,8],"stream":true,"sampling_params":{"max_new_tokens":2}}`
	}
	req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	perWrite := 2 * seqs
	for events := 0; sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: {") {
			if events++; events%perWrite == 0 && events < perWrite*writes {
				ack <- struct{}{}
			}
		}
	}
	waitFor(t, func() bool { return adminEndpoints(t, admin)[0].TPOT > 0 && tr.output.Load() > 0 })
	return adminEndpoints(t, admin)[0].TPOT, int(tr.output.Load())
}

// answers is a Traffic that keeps the output tokens of the answers,
// streamed and not.
type answers struct{ output, untimed atomic.Int64 }

func (*answers) Routed(float64, int, int, int, bool, bool) {}

func (a *answers) Answered(_, _, _ float64, output int, _, _ bool) { a.output.Add(int64(output)) }

func (a *answers) AnsweredOutput(_ float64, output int) { a.untimed.Add(int64(output)) }

// TestNonStreamedOutput: a non-streamed answer's output reaches the
// planner's traffic: by default a chat or completion the client did not
// stream is streamed from its engine (whole.go) and heard with its
// latencies, as a streamed one is; sent as the client sent it
// (NoStreamUpstream), and for SGLang's /generate, its usage (its
// completion tokens, /generate's meta_info), read in reads of any size,
// is heard without latencies.
func TestNonStreamedOutput(t *testing.T) {
	for _, c := range []struct {
		asSent          bool
		untimed, output []int64
	}{
		{false, []int64{0, 0, 3}, []int64{7, 12, 12}},
		{true, []int64{7, 12, 15}, []int64{0, 0, 0}},
	} {
		t.Run(fmt.Sprintf("no_stream_upstream=%v", c.asSent), func(t *testing.T) {
			e := startEngine(t, fleet.RoleBoth, nil)
			tr := &answers{}
			_, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, NoStreamUpstream: c.asSent}, Options{Traffic: tr})
			for i, q := range []struct{ path, body string }{
				{"/v1/chat/completions", `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":7}`},
				{"/v1/completions", `{"model":"` + testModel + `","prompt":"hi there","max_tokens":5}`},
				{"/generate", `{"model":"` + testModel + `","text":"hi","sampling_params":{"max_new_tokens":3}}`},
			} {
				if r := post(t, url+q.path, q.body, nil); r.status != 200 {
					t.Fatalf("%s: %d %s", q.path, r.status, r.body)
				}
				waitFor(t, func() bool { return tr.output.Load() == c.output[i] })
				if got, want := tr.untimed.Load(), c.untimed[i]; got != want {
					t.Fatalf("after %s the traffic heard %d untimed output tokens, want %d", q.path, got, want)
				}
			}
			readStream(t, url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"stream":true}`)
			waitFor(t, func() bool { return tr.output.Load() == c.output[2]+9 })
			if tr.untimed.Load() != c.untimed[2] {
				t.Errorf("a stream counted as untimed: %d", tr.untimed.Load())
			}
		})
	}
}
