package replicasync

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// fleets is one model's load fleet of two endpoints, a and b, speed 1 000
// tokens/s, no predictor (compute = Work.PrefillSeconds), and the prefix
// notes applied to it.
type fleets struct {
	f      *load.Fleet
	mu     *sync.Mutex
	noted  map[string]int // endpoint → keys noted routed, less withdrawn; "response ID" → 1 once noted
	places map[string]int // endpoint/adapter → places counted
}

func (x fleets) Place(model, endpoint, adapter string) (func(), bool) {
	if model != "m" || (endpoint != "a" && endpoint != "b") {
		return nil, false
	}
	k := endpoint + "/" + adapter
	x.mu.Lock()
	defer x.mu.Unlock()
	x.places[k]++
	return sync.OnceFunc(func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.places[k]--
	}), true
}

func (x fleets) placed(k string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.places[k]
}

func (x fleets) Prefix(model, endpoint string, keys []uint64, routed bool) bool {
	if model != "m" || (endpoint != "a" && endpoint != "b") {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if routed {
		x.noted[endpoint] += len(keys)
	} else {
		x.noted[endpoint] -= len(keys)
	}
	return true
}

func (x fleets) Response(model, endpoint, id string) bool {
	if model != "m" || (endpoint != "a" && endpoint != "b") {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.noted["response "+id] = len(endpoint)
	return true
}

func (x fleets) LoadFleet(model string) *load.Fleet {
	if model != "m" {
		return nil
	}
	return x.f
}

func newFleets() fleets {
	return fleets{f: load.New([]load.Info{{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000}, {Name: "b", Role: fleet.RoleBoth, PrefillSpeed: 1000}}, false),
		mu: &sync.Mutex{}, noted: map[string]int{}, places: map[string]int{}}
}

// state is endpoint name's in-flight requests, uncached tokens and queue
// wait at time now.
func state(f *load.Fleet, name string, now float64) (requests, uncached int, wait float64) {
	var snap sched.Snapshot
	eps := f.Snapshot(now, 0, nil, nil, nil, &snap)
	for i, e := range eps {
		if e.Info().Name == name {
			d := snap.Endpoints[i]
			return d.InflightRequests, d.InflightUncached, d.QueueWait
		}
	}
	return -1, -1, -1
}

// TestTwoReplicas: a flight routed on one replica loads the other's view
// of its endpoint over real ZMQ sockets, until its prefill ends and it
// finishes; a peer's flights are not sent on again.
func TestTwoReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := func() float64 { return 0 }
	fa, fb := newFleets(), newFleets()
	a, err := New(Config{Bind: "tcp://127.0.0.1:0", Heartbeat: 50 * time.Millisecond}, fa, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = a.Run(ctx) }()
	waitFor(t, "a binds", func() bool { return a.Addr() != "" })
	b, err := New(Config{Bind: "tcp://127.0.0.1:0", Peers: []string{a.Addr()}, Heartbeat: 50 * time.Millisecond}, fb, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { defer wg.Done(); _ = b.Run(ctx) }()
	fa.f.SetObserver(a.Observer("m"))
	fb.f.SetObserver(b.Observer("m"))

	// Subscriptions take a moment: route until b has heard one.
	var fl *load.Flight
	waitFor(t, "b hears a's route", func() bool {
		if fl != nil && b.Stats().Applied == 0 {
			fa.f.Finish(fl, 0)
		}
		if b.Stats().Applied > 0 {
			return true
		}
		fl = fa.f.Route(fa.f.Endpoint("a"), 0, load.Work{Uncached: 2000, Cached: 500, PrefillSeconds: 2, OpensConversation: true})
		return false
	})
	waitFor(t, "b loads it", func() bool {
		n, u, w := state(fb.f, "a", 0)
		return n == 1 && u == 2000 && w == 2
	})
	if n, _, _ := state(fb.f, "b", 0); n != 0 {
		t.Fatalf("endpoint b has %d requests on b's view", n)
	}
	fa.f.FirstToken(fl, 1.5)
	waitFor(t, "its prefill ends on b's view", func() bool {
		n, u, w := state(fb.f, "a", 0)
		return n == 1 && u == 0 && w == 0
	})
	fa.f.Finish(fl, 2)
	waitFor(t, "it finishes on b's view", func() bool {
		n, _, _ := state(fb.f, "a", 0)
		return n == 0 && b.Stats().PeerFlights == 0
	})
	a.Prefix("m", "b", []uint64{1, 2, 3}, true)
	a.Prefix("m", "b", []uint64{1}, false)
	waitFor(t, "b notes a's prefix", func() bool {
		fb.mu.Lock()
		defer fb.mu.Unlock()
		return fb.noted["b"] == 2
	})
	done := a.Place("m", "b", "sql")
	waitFor(t, "b counts a's adapter place", func() bool { return fb.placed("b/sql") == 1 })
	done()
	done()
	waitFor(t, "b counts it no more", func() bool { return fb.placed("b/sql") == 0 && b.Stats().PeerPlaces == 0 })
	// b routed nothing of its own: a hears no flight back.
	time.Sleep(100 * time.Millisecond)
	if st := a.Stats(); st.PeerFlights != 0 || st.Applied != 0 {
		t.Fatalf("a applied %d events, holds %d peer flights: a peer's flight was sent on", st.Applied, st.PeerFlights)
	}
	cancel()
	wg.Wait()
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newSync(t *testing.T, f Local) *Sync {
	t.Helper()
	s, err := New(Config{Heartbeat: time.Second}, f, func() float64 { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func routed(id uint64, ep string, uncached int) event {
	return event{Kind: kindRouted, ID: id, Model: "m", Endpoint: ep, Uncached: uncached, Compute: float64(uncached) / 1000}
}

// TestLiveSetEndsLostFlights: a flight the heartbeat's live set no longer
// names finishes (its end was lost), and a silent peer's flights all end.
func TestLiveSetEndsLostFlights(t *testing.T) {
	fs := newFleets()
	s := newSync(t, fs)
	now := time.Now()
	s.apply(&batch{Replica: 7, Events: []event{routed(1, "a", 100), routed(2, "a", 200), routed(3, "b", 300)}}, now)
	if n, u, _ := state(fs.f, "a", 0); n != 2 || u != 300 {
		t.Fatalf("a: %d requests, %d uncached; want 2, 300", n, u)
	}
	s.apply(&batch{Replica: 7, HasAlive: true, Alive: []uint64{1, 3, 99}}, now)
	if n, u, _ := state(fs.f, "a", 0); n != 1 || u != 100 {
		t.Fatalf("after the live set, a: %d requests, %d uncached; want 1, 100", n, u)
	}
	if st := s.Stats(); st.ExpiredByHeartbeat != 1 || st.PeerFlights != 2 {
		t.Fatalf("stats %+v", st)
	}
	s.endSilent(now.Add(2 * time.Second)) // two heartbeats: not yet
	if n, _, _ := state(fs.f, "b", 0); n != 1 {
		t.Fatalf("b: %d requests after 2 s of silence, want 1", n)
	}
	s.endSilent(now.Add(3 * time.Second))
	for _, ep := range []string{"a", "b"} {
		if n, _, _ := state(fs.f, ep, 0); n != 0 {
			t.Fatalf("%s: %d requests after 3 s of silence, want 0", ep, n)
		}
	}
	if st := s.Stats(); st.BySilence != 2 || st.Peers != 0 || st.PeerFlights != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSlowerPeersHeartbeat: a peer is silent after three of the slower
// heartbeat, its own or this replica's: a replica at 1 s ended the
// flights of a live peer at 5 s every 3 s, and then ignored their ends.
// A heartbeat out of range is not believed.
func TestSlowerPeersHeartbeat(t *testing.T) {
	fs := newFleets()
	s := newSync(t, fs) // 1 s
	now := time.Now()
	s.apply(&batch{Replica: 7, Heartbeat: 5, Events: []event{routed(1, "a", 100)}}, now)
	s.apply(&batch{Replica: 8, Heartbeat: 1e9, Events: []event{routed(1, "b", 100)}}, now)
	s.endSilent(now.Add(3 * time.Second))
	if n, _, _ := state(fs.f, "a", 0); n != 1 {
		t.Fatalf("a peer at 5 s ended after 3 s: %d requests", n)
	}
	if n, _, _ := state(fs.f, "b", 0); n != 0 {
		t.Fatalf("a peer claiming 1e9 s kept after 3 s: %d requests", n)
	}
	s.endSilent(now.Add(15 * time.Second))
	if n, _, _ := state(fs.f, "a", 0); n != 0 {
		t.Fatalf("a peer at 5 s kept after 15 s of silence: %d requests", n)
	}
}

// TestUnknownEndpointWarns: a peer's flight on an endpoint this replica
// does not know is ignored and, the first times, warned of by name
// (replicas naming a fleet's endpoints differently shared nothing in
// silence); the warnings are bounded.
func TestUnknownEndpointWarns(t *testing.T) {
	var logs bytes.Buffer
	s, err := New(Config{Heartbeat: time.Second}, newFleets(), func() float64 { return 0 }, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		s.apply(&batch{Replica: 7, Events: []event{routed(uint64(i+1), fmt.Sprintf("127.0.0.1:%d", 9000+i), 100)}}, time.Now())
	}
	if st := s.Stats(); st.Ignored != 100 {
		t.Fatalf("ignored %d, want 100", st.Ignored)
	}
	if n := strings.Count(logs.String(), "does not have"); n != maxUnknownWarnings || !strings.Contains(logs.String(), "127.0.0.1:9000") {
		t.Fatalf("%d warnings, want %d naming the endpoint:\n%s", n, maxUnknownWarnings, logs.String())
	}
}

// TestOtherBlockSize: a peer keying prompts in blocks of another size
// shares its load but not its prefix notes (their keys mean nothing
// here), and it is warned of once; they were applied in silence.
func TestOtherBlockSize(t *testing.T) {
	var logs bytes.Buffer
	s, err := New(Config{Heartbeat: time.Second, BlockSize: 16}, newFleets(), func() float64 { return 0 }, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	note := event{Kind: kindPrefix, Model: "m", Endpoint: "a", Keys: []uint64{1, 2, 3}}
	s.apply(&batch{Replica: 7, BlockSize: 32, Events: []event{note, note, routed(1, "a", 100)}}, time.Now())
	s.apply(&batch{Replica: 8, BlockSize: 16, Events: []event{note}}, time.Now())
	if st := s.Stats(); st.Ignored != 2 || st.Applied != 2 {
		t.Fatalf("ignored %d applied %d, want 2 and 2 (the other size's notes ignored, its flight and the same size's note applied)", st.Ignored, st.Applied)
	}
	if n := strings.Count(logs.String(), "blocks of another size"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
}

// TestRefused: every number and name a peer sends has a range, and state
// it may make a replica keep has a bound.
func TestRefused(t *testing.T) {
	long := strings.Repeat("x", maxName+1)
	for _, tc := range []struct {
		name string
		e    event
	}{
		{"negative uncached", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: "a", Uncached: -1}},
		{"huge cached", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: "a", Cached: maxTokens}},
		{"NaN compute", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: "a", Compute: math.NaN()}},
		{"infinite compute", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: "a", Compute: math.Inf(1)}},
		{"negative compute", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: "a", Compute: -1}},
		{"sequences", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: "a", Sequences: maxSequences + 1}},
		{"long model", event{Kind: kindRouted, ID: 1, Model: long, Endpoint: "a"}},
		{"long endpoint", event{Kind: kindRouted, ID: 1, Model: "m", Endpoint: long}},
		{"no model", event{Kind: kindRouted, ID: 1, Endpoint: "a"}},
		{"unknown kind", event{Kind: 99, ID: 5}},
		{"prefix without keys", event{Kind: kindPrefix, Model: "m", Endpoint: "a"}},
		{"prefix of too many keys", event{Kind: kindPrefix, Model: "m", Endpoint: "a", Keys: make([]uint64, maxKeys+1)}},
		{"prefix without endpoint", event{Kind: kindUnprefix, Model: "m", Keys: []uint64{1}}},
		{"response without id", event{Kind: kindResponse, Model: "m", Endpoint: "a"}},
		{"response of a long id", event{Kind: kindResponse, Model: "m", Endpoint: "a", Response: strings.Repeat("r", maxResponseID+1)}},
		{"response without endpoint", event{Kind: kindResponse, Model: "m", Response: "resp_1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFleets()
			s := newSync(t, fs)
			s.apply(&batch{Replica: 3, Events: []event{routed(5, "a", 10), tc.e}}, time.Now())
			if st := s.Stats(); st.Refused != 1 || st.Applied != 1 {
				t.Fatalf("stats %+v, want 1 refused and 1 applied", st)
			}
			if n, _, _ := state(fs.f, "a", 0); n != 1 {
				t.Fatalf("a: %d requests, want 1", n)
			}
		})
	}
	fs := newFleets()
	s := newSync(t, fs)
	s.apply(&batch{Replica: 3, Events: []event{routed(5, "a", 10), routed(5, "a", 10)}}, time.Now())
	if st := s.Stats(); st.Refused != 1 {
		t.Fatalf("a flight routed twice: stats %+v", st)
	}
	s.apply(&batch{Replica: 3, Events: []event{{Kind: kindFinished, ID: 6}, routed(8, "zz", 1), {Kind: kindRouted, ID: 9, Model: "other", Endpoint: "a"},
		{Kind: kindPrefix, Model: "m", Endpoint: "zz", Keys: []uint64{1}}, {Kind: kindResponse, Model: "m", Endpoint: "zz", Response: "resp_1"}}}, time.Now())
	if st := s.Stats(); st.Ignored != 5 {
		t.Fatalf("unknown flight, endpoint and model: stats %+v", st)
	}
	s.apply(&batch{Replica: 3, Events: []event{{Kind: kindResponse, Model: "m", Endpoint: "b", Response: "resp_2"}}}, time.Now())
	if fs.noted["response resp_2"] != 1 {
		t.Fatalf("a response note not applied: %v", fs.noted)
	}
	for r := uint64(1); r <= MaxPeers+1; r++ {
		s.apply(&batch{Replica: 1000 + r}, time.Now())
	}
	if st := s.Stats(); st.Peers != MaxPeers || st.Refused != 3 { // one before, two peers beyond (replica 3 is the 64th)
		t.Fatalf("peers beyond the bound: stats %+v", st)
	}
}

// TestPeerFlightsBounded: one peer cannot make a replica keep more than
// MaxPeerFlights of its flights.
func TestPeerFlightsBounded(t *testing.T) {
	fs := newFleets()
	s := newSync(t, fs)
	evs := make([]event, MaxPeerFlights+10)
	for i := range evs {
		evs[i] = routed(uint64(i+1), "a", 1)
	}
	s.apply(&batch{Replica: 3, Events: evs}, time.Now())
	if st := s.Stats(); st.PeerFlights != MaxPeerFlights || st.Refused != 10 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		c  Config
		ok bool
	}{
		{Config{}, true},
		{Config{Bind: "tcp://*:5600", Peers: []string{"tcp://10.0.0.2:5600", "tcp://gw-1.kvgate:5600"}}, true},
		{Config{Bind: "10.0.0.1:5600"}, false},
		{Config{Bind: "tcp://10.0.0.1"}, false},
		{Config{Peers: []string{"ipc:///tmp/x"}}, false},
		{Config{Peers: []string{"tcp://*:5600"}}, false},
		{Config{Peers: []string{"tcp://a:1", "tcp://a:1"}}, false},
		{Config{Bind: "tcp://*:1", Heartbeat: time.Millisecond}, false},
		{Config{Bind: "tcp://*:1", Heartbeat: 2 * time.Minute}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: err %v, want ok %v", tc.c, err, tc.ok)
		}
	}
}

// FuzzBatch: whatever bytes a peer sends, decoding and applying them
// neither panics nor leaves a flight with a number out of range.
func FuzzBatch(f *testing.F) {
	good, _ := msgpack.Marshal(&batch{Version: version, Replica: 9, Events: []event{routed(1, "a", 10), {Kind: kindFirstToken, ID: 1}},
		HasAlive: true, Alive: []uint64{1}})
	f.Add(good)
	f.Add([]byte{0x97, 0x01})
	f.Fuzz(func(t *testing.T, raw []byte) {
		fs := newFleets()
		s := newSync(t, fs)
		var b batch
		if err := msgpack.Unmarshal(raw, &b); err != nil {
			return
		}
		s.apply(&b, time.Now())
		for _, ep := range []string{"a", "b"} {
			if n, u, w := state(fs.f, ep, 0); n < 0 || u < 0 || math.IsNaN(w) || w < 0 || w > float64(MaxPeerFlights)*maxCompute {
				t.Fatalf("%s: %d requests, %d uncached, wait %v", ep, n, u, w)
			}
		}
	})
}

// TestBindTaken: a bind address already in use is Run's error, not a
// replica that silently publishes nothing.
func TestBindTaken(t *testing.T) {
	first, err := New(Config{Bind: "tcp://127.0.0.1:0"}, newFleets(), func() float64 { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = first.Run(ctx) }()
	waitFor(t, "the first binds", func() bool { return first.Addr() != "" })
	second, err := New(Config{Bind: first.Addr()}, newFleets(), func() float64 { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Run(ctx); err == nil || !strings.Contains(err.Error(), "sync.bind") {
		t.Fatalf("Run on a taken address: %v", err)
	}
	cancel()
	<-done
}

// TestPlacesEnd: a peer's LoRA adapter place ends with its release, when
// the heartbeat's live set no longer names it, or with the peer's
// silence; a second release does nothing.
func TestPlacesEnd(t *testing.T) {
	fs := newFleets()
	s := newSync(t, fs)
	now := time.Now()
	place := func(id uint64, ep string) event {
		return event{Kind: kindPlace, ID: id, Model: "m", Endpoint: ep, Adapter: "sql"}
	}
	s.apply(&batch{Replica: 7, Events: []event{place(1, "a"), place(2, "a"), place(3, "b"), place(4, "zz"),
		{Kind: kindPlace, ID: 5, Model: "m", Endpoint: "a"}}}, now)
	if a, b := fs.placed("a/sql"), fs.placed("b/sql"); a != 2 || b != 1 {
		t.Fatalf("places a %d b %d, want 2 1", a, b)
	}
	if st := s.Stats(); st.Ignored != 1 || st.Refused != 1 || st.PeerPlaces != 3 {
		t.Fatalf("unknown endpoint, no adapter: stats %+v", st)
	}
	s.apply(&batch{Replica: 7, Events: []event{{Kind: kindUnplace, ID: 1}, {Kind: kindUnplace, ID: 1}}}, now)
	if a := fs.placed("a/sql"); a != 1 {
		t.Fatalf("a: %d places after one release, want 1", a)
	}
	s.apply(&batch{Replica: 7, HasAlive: true, Alive: []uint64{3}}, now)
	if a, b := fs.placed("a/sql"), fs.placed("b/sql"); a != 0 || b != 1 {
		t.Fatalf("after the live set: a %d b %d, want 0 1", a, b)
	}
	s.endSilent(now.Add(3 * time.Second))
	if b := fs.placed("b/sql"); b != 0 {
		t.Fatalf("b: %d places after the peer's silence", b)
	}
}

// BenchmarkFlightLifecycle: one request's accounting on a fleet (route,
// first token, finish) without and with the sync's observer (its events
// queued; nothing published: the cost on the request path).
func BenchmarkFlightLifecycle(b *testing.B) {
	for _, synced := range []bool{false, true} {
		name := "alone"
		if synced {
			name = "synced"
		}
		b.Run(name, func(b *testing.B) {
			fs := newFleets()
			var s *Sync
			if synced {
				var err error
				// Bound only in name: Run is not called, its events are drained below.
				if s, err = New(Config{Bind: "tcp://127.0.0.1:0"}, fs, func() float64 { return 0 }, nil); err != nil {
					b.Fatal(err)
				}
				fs.f.SetObserver(s.Observer("m"))
			}
			ep := fs.f.Endpoint("a")
			keys := make([]uint64, 256) // a 4 096-token prompt
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				at := float64(i)
				fl := fs.f.Route(ep, at, load.Work{Uncached: 1000, Cached: 3096, PrefillSeconds: 0.05})
				if s != nil {
					s.Prefix("m", "a", keys, true)
				}
				fs.f.FirstToken(fl, at+0.05)
				fs.f.Finish(fl, at+0.5)
				if s != nil && i%1024 == 0 {
					s.take(false) // what the publisher drains
				}
			}
		})
	}
}

// TestSubscriberOnly: a replica that binds nothing publishes nothing, so
// its fleets have no observer and its prefix notes and places queue no
// event.
func TestSubscriberOnly(t *testing.T) {
	s, err := New(Config{Peers: []string{"tcp://127.0.0.1:1"}}, newFleets(), func() float64 { return 0 }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := s.Observer("m"); o != nil {
		t.Fatalf("observer %v", o)
	}
	s.Prefix("m", "a", []uint64{1}, true)
	s.Place("m", "a", "sql")()
	if b := s.take(true); len(b.Events) != 0 || len(b.Alive) != 0 {
		t.Fatalf("queued %+v", b)
	}
}

// TestHeldBounded: the flights and places of all peers together are
// bounded; a slot frees when one ends.
func TestHeldBounded(t *testing.T) {
	fs := newFleets()
	s := newSync(t, fs)
	s.maxHeld = 4
	now := time.Now()
	place := event{Kind: kindPlace, ID: 9, Model: "m", Endpoint: "a", Adapter: "sql"}
	s.apply(&batch{Replica: 1, Events: []event{routed(1, "a", 1), routed(2, "a", 1), place}}, now)
	s.apply(&batch{Replica: 2, Events: []event{routed(1, "b", 1), routed(2, "b", 1), place}}, now)
	if st := s.Stats(); st.PeerFlights+st.PeerPlaces != 4 || st.Refused != 2 {
		t.Fatalf("stats %+v, want 4 held and 2 refused", st)
	}
	s.apply(&batch{Replica: 1, Events: []event{{Kind: kindFinished, ID: 1}, routed(3, "a", 1)}}, now)
	if st := s.Stats(); st.PeerFlights+st.PeerPlaces != 4 || st.Refused != 2 {
		t.Fatalf("after one ended: stats %+v", st)
	}
	s.endSilent(now.Add(time.Hour))
	if s.held != 0 {
		t.Fatalf("held %d after every peer went silent", s.held)
	}
}

// TestOwnAddressAmongPeers: every replica may be given the same peer list,
// its own address included: it hears its own messages and ignores them,
// so its own requests are not counted twice.
func TestOwnAddressAmongPeers(t *testing.T) {
	fs := newFleets()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var s *Sync
	done := make(chan struct{})
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := "tcp://" + ln.Addr().String()
		ln.Close()
		if s, err = New(Config{Bind: addr, Peers: []string{addr}, Heartbeat: 20 * time.Millisecond}, fs, func() float64 { return 0 }, nil); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- s.Run(ctx); close(done) }()
		waitFor(t, "bound or failed", func() bool { return s.Addr() != "" || len(errc) > 0 })
		if s.Addr() != "" {
			break
		}
		if attempt == 3 {
			t.Fatalf("could not bind: %v", <-errc)
		}
		done = make(chan struct{}) // the port was taken meanwhile: another
	}
	fs.f.SetObserver(s.Observer("m"))
	fl := fs.f.Route(fs.f.Endpoint("a"), 0, load.Work{Uncached: 100, PrefillSeconds: 0.1})
	time.Sleep(200 * time.Millisecond) // ten heartbeats: its own messages have come back
	if n, _, _ := state(fs.f, "a", 0); n != 1 {
		t.Fatalf("a: %d requests in flight, want 1 (its own, once)", n)
	}
	if st := s.Stats(); st.Peers != 0 || st.PeerFlights != 0 || st.Sent == 0 {
		t.Fatalf("stats %+v", st)
	}
	fs.f.Finish(fl, 1)
	cancel()
	<-done
}

// oldEvent is an event as replicas wrote it before kindResponse.
type oldEvent struct {
	_              struct{} `msgpack:",as_array"`
	Kind           uint8
	ID             uint64
	Model          string
	Endpoint       string
	Uncached       int
	Cached         int
	UncachedBlocks int
	Sequences      int
	Compute        float64
	Opens          bool
	Keys           []uint64
	Adapter        string
}

// TestEventWireCompat: the Response field, appended to an event, keeps
// replicas of the version before it and this one reading each other: an
// old event reads with no response, a new one (its batch too) reads on
// an old replica without it.
func TestEventWireCompat(t *testing.T) {
	b, _ := msgpack.Marshal(oldEvent{Kind: 1, ID: 2, Model: "m", Adapter: "x"})
	var e event
	if err := msgpack.Unmarshal(b, &e); err != nil || e.Adapter != "x" || e.Model != "m" {
		t.Fatalf("old -> new: %v %+v", err, e)
	}
	b, _ = msgpack.Marshal(event{Kind: kindResponse, Model: "m", Adapter: "y", Response: "resp"})
	var o oldEvent
	if err := msgpack.Unmarshal(b, &o); err != nil || o.Adapter != "y" {
		t.Fatalf("new -> old: %v %+v", err, o)
	}
	b, _ = msgpack.Marshal(batch{Events: []event{{Kind: kindResponse, Response: "r"}, {Kind: 1, Model: "m2"}}})
	type oldBatch struct {
		_        struct{} `msgpack:",as_array"`
		Version  uint8
		Replica  uint64
		Events   []oldEvent
		HasAlive bool
		Alive    []uint64
	}
	var ob oldBatch
	if err := msgpack.Unmarshal(b, &ob); err != nil || len(ob.Events) != 2 || ob.Events[1].Model != "m2" {
		t.Fatalf("new batch -> old: %v %+v", err, ob)
	}
	b, _ = msgpack.Marshal(oldBatch{Version: 1, Replica: 3, HasAlive: true})
	var nb batch
	if err := msgpack.Unmarshal(b, &nb); err != nil || nb.Replica != 3 || !nb.HasAlive || nb.Heartbeat != 0 {
		t.Fatalf("old batch -> new: %v %+v", err, nb)
	}
}
