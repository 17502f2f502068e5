package gateway

import (
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
)

// blocksOf is the index's count of endpoint name's blocks (precise).
func blocksOf(g *Gateway, name string) int64 {
	for _, st := range g.idx.Stats() {
		if st.Endpoint == name {
			return st.GPUBlocks
		}
	}
	return -1
}

// TestKVEventsAtConnection: with a replay endpoint, the engine's buffer
// is asked when its PUB accepts the connection, not at its next batch: a
// gateway started beside a quiet engine knows its blocks at once, and an
// engine restarted on its ports (its replay does not continue what was
// applied) has its old blocks dropped at once; a request between the
// two is answered as before. Before, both waited for the engine's next
// batch, which a quiet engine may not send for long.
func TestKVEventsAtConnection(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, nil)
	if r := post(t, e.URL()+"/v1/completions", completion(prefix("quiet"), false, 1), nil); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	ep := endpointOf(e, fleet.RoleBoth)
	g, _, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{ep}, NoHealthChecks: true}, Options{})
	waitFor(t, func() bool { return blocksOf(g, ep.Name) > 30 }) // the quiet engine's prompt, ~600 tokens
	events, replay := e.KVEventsEndpoint(), e.KVEventsReplayEndpoint()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.KVEventsEndpoint, c.KVEventsReplayEndpoint = events, replay })
	waitFor(t, func() bool { return blocksOf(g, ep.Name) == 0 })
}
