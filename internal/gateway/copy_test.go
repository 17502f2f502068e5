package gateway

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestPrefixCopiedAheadOfTheBalance: on an idle fleet of two engines,
// conversations opening with one system prompt stay on its holder until
// kvgate's balance would move one; that one stays too, and the gateway
// copies the system prompt to the other engine (a one-token request of
// the prompt's engine ids), so the next conversation moves there and
// finds it cached. With ids that are not the engine's own (the
// estimating tokenizer) nothing can be copied, and the balance moves the
// conversation itself.
func TestPrefixCopiedAheadOfTheBalance(t *testing.T) {
	for _, exact := range []bool{true, false} {
		t.Run(fmt.Sprintf("engine ids %v", exact), func(t *testing.T) {
			e1, _, eps := twoAggregated(t)
			tok := "model=" + testModel + ",source=engine,url=" + e1.URL()
			if !exact {
				tok = "model=" + testModel + ",source=estimate"
			}
			g, url, admin := startGateway(t, Config{Endpoints: eps, Tokenizers: []string{tok}, Policy: "kvgate"}, Options{})
			waitSubscribed(t, g)
			open := func(i int) result {
				t.Helper()
				r := openConversation(t, url, i)
				if r.status != 200 {
					t.Fatalf("conversation %d: %d %s", i, r.status, r.body)
				}
				return r
			}
			home := open(0).header.Get(hdrPrefill)
			waitFor(t, func() bool { return endpointBlocks(t, admin, home) > 0 })
			// Conversation 1 stays (the decayed count of 1 is under the
			// limit); conversation 2 is the one the balance moves.
			if r := open(1); r.header.Get(hdrPrefill) != home {
				t.Fatalf("conversation 1 went to %s, its system prompt is on %s", r.header.Get(hdrPrefill), home)
			}
			r := open(2)
			cached, _ := strconv.Atoi(r.header.Get(hdrCached))
			if !exact {
				if r.header.Get(hdrPrefill) == home || cached != 0 {
					t.Fatalf("conversation 2: %s with %d tokens cached, want moved off %s, computing all", r.header.Get(hdrPrefill), cached, home)
				}
				if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_prefix_copies_total{outcome="done"} 0`) {
					t.Fatal("a prefix copied without the engine's ids")
				}
				return
			}
			if r.header.Get(hdrPrefill) != home || cached == 0 {
				t.Fatalf("conversation 2: %s with %d tokens cached, want kept on %s", r.header.Get(hdrPrefill), cached, home)
			}
			if why := r.header.Get(hdrReason); !strings.Contains(why, "tokens copied to ") || strings.Contains(why, "copied to "+home) {
				t.Fatalf("conversation 2's reason %q does not name the copy to the other engine", why)
			}
			waitFor(t, func() bool {
				m := get(t, admin+"/metrics")
				return strings.Contains(m, `kvgate_prefix_copies_total{outcome="done"} 1`) &&
					!strings.Contains(m, `kvgate_prefix_copy_tokens_total{kind="computed"} 0`)
			})
			r = open(3)
			if r.header.Get(hdrPrefill) == home || r.header.Get(hdrCached) == "0" {
				t.Fatalf("conversation 3: %s with %s tokens cached, want the copy's engine with the system prompt cached (reason %q)",
					r.header.Get(hdrPrefill), r.header.Get(hdrCached), r.header.Get(hdrReason))
			}
		})
	}
}

// TestPrefixCopyFails: a copy the other engine does not answer (it is
// gone, and no health check has noticed) is counted failed, and the
// index entries that claimed the prefix there are taken back: the next
// conversation is not sent there believing it holds the system prompt
// (which would fail and be retried), but kept on the holder with
// another copy tried.
func TestPrefixCopyFails(t *testing.T) {
	e1, e2, eps := twoAggregated(t)
	tok := startEngine(t, fleet.RoleBoth, nil) // tokenizes; not in the fleet, so it stays up
	cfg := Config{Endpoints: eps, Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + tok.URL()},
		Policy: "kvgate", NoHealthChecks: true}
	g, url, admin := startGateway(t, cfg, Options{})
	waitSubscribed(t, g)
	open := func(i int) result { return openConversation(t, url, i) }
	home := open(0).header.Get(hdrPrefill)
	waitFor(t, func() bool { return endpointBlocks(t, admin, home) > 0 })
	if r := open(1); r.header.Get(hdrPrefill) != home {
		t.Fatalf("conversation 1 went to %s, its system prompt is on %s", r.header.Get(hdrPrefill), home)
	}
	other := e2
	if home == e2.Addr() {
		other = e1
	}
	other.Close()
	if r := open(2); r.status != 200 || r.header.Get(hdrPrefill) != home {
		t.Fatalf("conversation 2: %d on %s, want served on %s", r.status, r.header.Get(hdrPrefill), home)
	}
	waitFor(t, func() bool {
		return strings.Contains(get(t, admin+"/metrics"), `kvgate_prefix_copies_total{outcome="failed"} 1`)
	})
	if r := open(3); r.status != 200 || r.header.Get(hdrPrefill) != home {
		t.Fatalf("conversation 3: %d on %s, want served on %s", r.status, r.header.Get(hdrPrefill), home)
	}
	waitFor(t, func() bool {
		return strings.Contains(get(t, admin+"/metrics"), `kvgate_prefix_copies_total{outcome="failed"} 2`)
	})
	if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_retries_total 0") {
		t.Fatal("a conversation was sent to the engine whose copy failed and retried")
	}
}

// openConversation sends conversation i's opening turn: one system
// prompt shared by every conversation, and its own question.
func openConversation(t *testing.T, url string, i int) result {
	t.Helper()
	sys := map[string]string{"role": "system", "content": prefix("sys")}
	user := map[string]string{"role": "user", "content": fmt.Sprintf("question %d", i)}
	b, _ := json.Marshal(map[string]any{"model": testModel, "messages": []any{sys, user}, "max_tokens": 2})
	return post(t, url+"/v1/chat/completions", string(b), nil)
}

// endpointBlocks is the KV blocks the index holds for the named endpoint.
func endpointBlocks(t *testing.T, admin, name string) int {
	t.Helper()
	var st struct {
		Endpoints []EndpointState `json:"endpoints"`
	}
	getJSON(t, admin+"/admin/endpoints", &st)
	for _, e := range st.Endpoints {
		if e.Name == name {
			return int(e.KVBlocks)
		}
	}
	return 0
}
