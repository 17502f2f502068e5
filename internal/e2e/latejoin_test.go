package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// TestIndexJoinsLateAndReplays: an emulated engine serves prompts before
// the index subscribes; when the index joins, the first live batch has a
// sequence number past the start, and the index asks the engine's replay
// socket for what came before, so every earlier prompt is found. Run with
// vLLM's numbering (from 0, nil parent at a chain start) and with
// llm-d-inference-sim's (from 1, parent 0), in both encodings.
func TestIndexJoinsLateAndReplays(t *testing.T) {
	for _, style := range []kvpub.Style{kvpub.StyleVLLM, kvpub.StyleLLMDSim} {
		for _, format := range []kvpub.Format{kvpub.FormatArray, kvpub.FormatMap} {
			t.Run(style.String()+"/"+format.String(), func(t *testing.T) {
				testLateJoin(t, style, format)
			})
		}
	}
}

func testLateJoin(t *testing.T, style kvpub.Style, format kvpub.Format) {
	cfg := engine.DefaultConfig()
	cfg.Model, cfg.Port, cfg.TimeScale, cfg.Logger = model, 0, 100, quiet()
	cfg.KVEventsEndpoint, cfg.KVEventsReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	cfg.KVEventsFormat, cfg.KVEventsStyle = format, style
	e := startEngineCfg(t, cfg)

	// Before the index exists: three prompts, each stored in its own
	// batches.
	const routerBS = 16
	var earlier [][]tokens.BlockKey
	for i := range 3 {
		prompt := strings.TrimSpace(strings.Repeat(fmt.Sprintf("early prompt %d says hello ", i), 12))
		var tok struct {
			Tokens []uint32 `json:"tokens"`
		}
		post(t, e.URL()+"/tokenize", map[string]any{"model": model, "prompt": prompt}, &tok)
		post(t, e.URL()+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}, nil)
		keys := tokens.NewHasher(routerBS).Keys(tok.Tokens, nil)
		if len(keys) < 2 {
			t.Fatalf("prompt %d: only %d blocks", i, len(keys))
		}
		earlier = append(earlier, keys)
	}

	idx := kvindex.New(kvindex.Config{BlockSize: routerBS})
	sub := runSubscriber(t, idx, []kvevents.EngineConfig{{
		Name: e.Addr(), Model: model, Events: e.KVEventsEndpoint(), Replay: e.KVEventsReplayEndpoint(),
	}})

	// Live traffic until a live batch reaches the index (the SUB may join
	// after the first ones: ZMQ's slow joiner).
	deadline := time.Now().Add(10 * time.Second) // hang guard
	var st kvevents.EngineSnapshot
	for i := 0; ; i++ {
		post(t, e.URL()+"/v1/completions", map[string]any{"model": model, "prompt": strings.Repeat(fmt.Sprintf("live %d ", i), 20), "max_tokens": 1}, nil)
		time.Sleep(20 * time.Millisecond)
		st = sub.Stats()[0]
		if st.LastSeq != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live batch reached the index: %+v", st)
		}
	}
	for i, keys := range earlier {
		ms := idx.Lookup(model, keys, nil)
		if len(ms) != 1 || ms[0].Blocks != len(keys) {
			t.Errorf("earlier prompt %d: index matches %+v, want all %d blocks", i, ms, len(keys))
		}
	}
	if st.Replays == 0 || st.ReplayedBatches == 0 || st.Unrecovered != 0 || st.OrphanBlocks != 0 || st.Malformed != 0 {
		t.Errorf("stats %+v", st)
	}
}
