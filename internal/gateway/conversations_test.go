package gateway

import (
	"encoding/json"
	"testing"
)

// TestChatOpensConversation: a chat request without an assistant message
// counts a conversation on the endpoint it went to (what kvgate's policy
// keeps in balance, shown in /admin/endpoints); a later turn of it and a
// completion do not.
func TestChatOpensConversation(t *testing.T) {
	e1, _, eps := twoAggregated(t)
	cfg := Config{
		Endpoints:  eps,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + e1.URL()},
		Policy:     "kvgate",
	}
	_, url, admin := startGateway(t, cfg, Options{})
	conversations := func() map[string]float64 {
		var st struct {
			Endpoints []EndpointState `json:"endpoints"`
		}
		getJSON(t, admin+"/admin/endpoints", &st)
		out := map[string]float64{}
		for _, e := range st.Endpoints {
			out[e.Name] = e.Load.Conversations
		}
		return out
	}
	chat := func(msgs ...map[string]string) string {
		b, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "max_tokens": 2})
		return string(b)
	}
	sys := map[string]string{"role": "system", "content": prefix("sys")}
	user := map[string]string{"role": "user", "content": "first question"}
	r := post(t, url+"/v1/chat/completions", chat(sys, user), nil)
	if r.status != 200 {
		t.Fatalf("opening turn: %d %s", r.status, r.body)
	}
	home := r.header.Get(hdrPrefill)
	total := func(c map[string]float64) (sum float64) {
		for _, v := range c {
			sum += v
		}
		return sum
	}
	c := conversations()
	if c[home] < 0.99 || c[home] > 1 || total(c) > 1 {
		t.Fatalf("after one opening turn on %s: conversations %v, want 1 there", home, c)
	}
	later := chat(sys, user, map[string]string{"role": "assistant", "content": "an answer"},
		map[string]string{"role": "user", "content": "second question"})
	if r = post(t, url+"/v1/chat/completions", later, nil); r.status != 200 {
		t.Fatalf("later turn: %d %s", r.status, r.body)
	}
	if r = post(t, url+"/v1/completions", completion(prefix("sys")+" raw", false, 2), nil); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	if c = conversations(); total(c) > 1 {
		t.Fatalf("a later turn or a completion counted as a new conversation: %v", c)
	}
}
