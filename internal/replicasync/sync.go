// Package replicasync shares the in-flight load between gateway replicas
// in front of one fleet. Each replica's load accounting (internal/load)
// otherwise counts only the requests it routed itself: with three
// replicas each sees a third of every engine's queue, predicts its
// requests' first tokens too early and admits what then misses its SLO.
//
// Each replica publishes its own flights' lifecycle on a ZMQ PUB socket
// (routed to an endpoint with its uncached and cached tokens, decoding on
// an endpoint, prefill ended, finished) and subscribes to every peer's;
// a peer's flights are routed on the replica's own load fleet as
// load.Work.Peer flights, so its queues, in-flight tokens, decode streams
// and conversations count them, and its predictor learns from their first
// tokens as from its own. The prefixes a replica notes routed to an
// endpoint (the index's routed entries) and the batch places its LoRA
// adapters' requests take are shared too. Each message carries, once a heartbeat, the
// sender's live flights: a flight whose end was lost (a dropped message,
// a reconnection) finishes at the next heartbeat, and every flight of a
// peer silent for three heartbeats (it stopped, or restarted under a new
// replica id) finishes then.
//
// The wire: frame 1 the topic "kvgate.sync", frame 2 one msgpack batch
// (batch below), arrays not maps.
package replicasync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/zmtp"
)

// Topic is the first frame of every message.
const Topic = "kvgate.sync"

// Limits on what a peer may send and the state it may make a replica keep.
const (
	// MaxPeers is how many replicas' flights are kept at once; messages of
	// more are dropped (counted).
	MaxPeers = 64
	// MaxPeerFlights bounds one peer's live flights; routes beyond it are
	// dropped (counted).
	MaxPeerFlights = 1 << 17
	// MaxHeld bounds the flights and adapter places of all peers kept at
	// once (about 100 MiB); more are refused (counted).
	MaxHeld = 1 << 18
	// maxName bounds a model or endpoint name.
	maxName = 1024
	// maxTokens bounds a token count; maxCompute a predicted compute time
	// (seconds); maxSequences a request's sequences.
	maxTokens    = 1 << 31
	maxCompute   = 86400
	maxSequences = 1 << 16
	// maxBlockSize bounds a peer's block size (the gateway's range).
	maxBlockSize = 4096
	// maxKeys bounds a prefix note's block keys (a 2-million-token prompt
	// in 16-token blocks).
	maxKeys = 1 << 17
	// maxResponseID bounds a Responses API answer's id (vLLM's are
	// "resp_" and 32 hex digits).
	maxResponseID = 128
	// maxPending bounds the events waiting to be published; more are
	// dropped (counted) and repaired by the next heartbeat's live set.
	maxPending = 1 << 16
	// silentBeats is how many heartbeats of silence end a peer.
	silentBeats = 3
	version     = 1
)

// Event kinds.
const (
	kindRouted uint8 = iota + 1
	kindDecoding
	kindPrefilled
	kindFirstToken // prefilled, observed
	kindFinished
	kindPrefix   // the endpoint will hold the keys (the index's routed entries)
	kindUnprefix // it will not after all
	kindPlace    // a request for a LoRA adapter takes its place in the endpoint's batch
	kindUnplace  // and gives it up
	kindResponse // the endpoint made (and may keep) the Responses API answer of this id
)

// Config configures a replica's sync.
type Config struct {
	// Bind is where the replica's PUB listens (tcp://HOST:PORT; "*" for
	// every interface); "" publishes nothing.
	Bind string `yaml:"bind"`
	// Peers are the other replicas' Bind addresses, dialled (and
	// redialled) by the replica's SUB. Its own address may be among them:
	// its own messages are recognized and ignored.
	Peers []string `yaml:"peers"`
	// Heartbeat is how often the live set is sent (default 1 s, in
	// [10 ms, 1 min]); a peer silent for three is ended.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// BlockSize is the replica's router block size (the gateway's; 0:
	// unknown): a peer's prefix notes are block keys, which mean nothing
	// to a replica that keys prompts in blocks of another size.
	BlockSize int `yaml:"-"`
}

// Enabled reports whether the config asks for any sync.
func (c Config) Enabled() bool { return c.Bind != "" || len(c.Peers) > 0 }

// The heartbeat's range.
const (
	minHeartbeat = 10 * time.Millisecond
	maxHeartbeat = time.Minute
)

// Validate checks the addresses and the heartbeat.
func (c Config) Validate() error {
	if c.Bind != "" {
		if err := zmtp.CheckEndpoint(c.Bind, true); err != nil {
			return fmt.Errorf("sync.bind: %w", err)
		}
	}
	if len(c.Peers) > MaxPeers {
		return fmt.Errorf("sync.peers: %d peers, at most %d", len(c.Peers), MaxPeers)
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		if err := zmtp.CheckEndpoint(p, false); err != nil {
			return fmt.Errorf("sync.peers: %w", err)
		}
		if seen[p] {
			return fmt.Errorf("sync.peers: %q twice", p)
		}
		seen[p] = true
	}
	if c.Heartbeat != 0 && (c.Heartbeat < minHeartbeat || c.Heartbeat > maxHeartbeat) {
		return fmt.Errorf("sync.heartbeat: %v is not in [10ms, 1m]", c.Heartbeat)
	}
	return nil
}

// Local is what a peer's events are applied to: the replica's load
// fleets and its prefix index.
type Local interface {
	// LoadFleet is the load fleet of a model, or nil when the replica
	// serves no such model (yet).
	LoadFleet(model string) *load.Fleet
	// Place counts a request for a LoRA adapter on endpoint of model in
	// flight, as the replica counts its own (the LoRA batch places), until
	// done is called; false when it knows no such endpoint of model.
	Place(model, endpoint, adapter string) (done func(), ok bool)
	// Prefix notes (routed) or withdraws (not routed) that endpoint will
	// hold the block keys of a prompt a peer sent there, as the replica
	// notes its own (kvindex.Index.Routed, Unrouted) until the engine's KV
	// events tell; false when it knows no such endpoint of model.
	Prefix(model, endpoint string, keys []uint64, routed bool) bool
	// Response notes that endpoint of model made the Responses API answer
	// id, which an engine with a response store keeps: a request
	// continuing it, and its GET, must go there. false when it knows no
	// such endpoint of model.
	Response(model, endpoint, id string) bool
}

// Stats are a replica's sync counters.
type Stats struct {
	Sent, SendDropped             uint64 // events published; events dropped before publishing
	Received, Applied             uint64 // events received; applied to a fleet
	Ignored                       uint64 // unknown model, endpoint or flight
	Refused                       uint64 // malformed messages, or beyond a limit
	PeerFlights                   int    // peers' flights loaded now
	PeerPlaces                    int    // peers' LoRA adapter places counted now
	Peers                         int    // peers heard within three heartbeats
	ExpiredByHeartbeat, BySilence uint64 // peers' flights ended without their end heard
}

// Sync is one replica's side: the observer its fleets report to, the
// publisher and the subscriber.
type Sync struct {
	cfg   Config
	local Local
	clock func() float64 // the fleets' time
	log   *slog.Logger
	id    uint64 // this replica, random per start

	mu      sync.Mutex
	nextID  uint64
	ids     map[*load.Flight]uint64 // own live flights
	places  map[uint64]struct{}     // own live adapter places
	pending []event
	wake    chan struct{}

	pmu   sync.Mutex
	peers map[uint64]*peer
	held  int // flights and places of all peers
	// maxHeld bounds held (MaxHeld; tests lower it).
	maxHeld int
	// unknown is the peers' model and endpoint names this replica has
	// warned it does not know (at most maxUnknownWarnings).
	unknown map[string]bool

	bound atomic.Pointer[string] // the PUB's address once bound

	st struct {
		sent, sendDropped, received, applied, ignored, refused, byBeat, bySilence atomic.Uint64
	}
}

type peer struct {
	flights map[uint64]peerFlight
	places  map[uint64]func() // adapter places: their done
	heard   time.Time
	// beat is the peer's heartbeat (0: a replica that does not say).
	beat time.Duration
	// blockSize is the peer's router block size (0: not said); warned,
	// whether its difference from this replica's was logged.
	blockSize int
	warned    bool
}

// maxUnknownWarnings bounds the warnings about names a peer uses that
// this replica does not know.
const maxUnknownWarnings = 16

type peerFlight struct {
	fleet *load.Fleet
	fl    *load.Flight
}

// New returns a replica's sync; Run starts it.
func New(cfg Config, local Local, clock func() float64, log *slog.Logger) (*Sync, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sync{cfg: cfg, local: local, clock: clock, log: log, id: rand.Uint64() | 1,
		maxHeld: MaxHeld, ids: map[*load.Flight]uint64{}, places: map[uint64]struct{}{}, wake: make(chan struct{}, 1), peers: map[uint64]*peer{}}, nil
}

// Observer is what a model's fleet reports its own flights to
// (load.Fleet.SetObserver); nil when the replica publishes nothing (no
// Bind).
func (s *Sync) Observer(model string) load.Observer {
	if s.cfg.Bind == "" {
		return nil
	}
	return observer{s: s, model: model}
}

// Stats returns the counters.
func (s *Sync) Stats() Stats {
	s.pmu.Lock()
	n, places := 0, 0
	for _, p := range s.peers {
		n += len(p.flights)
		places += len(p.places)
	}
	peers := len(s.peers)
	s.pmu.Unlock()
	return Stats{Sent: s.st.sent.Load(), SendDropped: s.st.sendDropped.Load(), Received: s.st.received.Load(),
		Applied: s.st.applied.Load(), Ignored: s.st.ignored.Load(), Refused: s.st.refused.Load(), PeerFlights: n, PeerPlaces: places,
		Peers: peers, ExpiredByHeartbeat: s.st.byBeat.Load(), BySilence: s.st.bySilence.Load()}
}

// Addr is the bound PUB's address (tcp://HOST:PORT; its port when Bind
// asked for port 0), "" before Run has bound it or without Bind.
func (s *Sync) Addr() string {
	if p := s.bound.Load(); p != nil {
		return *p
	}
	return ""
}

// Run publishes and subscribes until ctx ends (Addr tells the bound
// address once it is).
func (s *Sync) Run(ctx context.Context) error {
	opts := zmtp.Options{Logger: s.log}
	var pub *zmtp.Pub
	bound := ""
	if s.cfg.Bind != "" {
		p, err := zmtp.NewPub(opts)
		if err != nil {
			return err
		}
		defer p.Close()
		a, err := p.Bind(s.cfg.Bind)
		if err != nil {
			return fmt.Errorf("sync.bind %s: %w", s.cfg.Bind, err)
		}
		pub, bound = p, "tcp://"+a.String()
	}
	var sub *zmtp.Sub
	if len(s.cfg.Peers) > 0 {
		b, err := zmtp.NewSub(opts)
		if err != nil {
			return err
		}
		defer b.Close()
		b.Subscribe([]byte(Topic))
		for _, p := range s.cfg.Peers {
			if err := b.Dial(p); err != nil {
				return fmt.Errorf("sync.peers %s: %w", p, err)
			}
		}
		sub = b
	}
	s.bound.Store(&bound)
	var wg sync.WaitGroup
	if sub != nil {
		wg.Add(1)
		go func() { defer wg.Done(); s.receive(ctx, sub) }()
	}
	s.publish(ctx, pub)
	wg.Wait()
	s.endAll()
	return nil
}

// publish sends the pending events as they come, and the live set every
// heartbeat; it also ends silent peers. It returns when ctx ends.
func (s *Sync) publish(ctx context.Context, pub *zmtp.Pub) {
	beat := time.NewTicker(s.cfg.Heartbeat)
	defer beat.Stop()
	for {
		alive := false
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-beat.C:
			alive = true
			s.endSilent(time.Now())
		}
		b := s.take(alive)
		if pub == nil || (len(b.Events) == 0 && !alive) {
			continue
		}
		b.Version, b.Replica, b.Heartbeat, b.BlockSize = version, s.id, s.cfg.Heartbeat.Seconds(), s.cfg.BlockSize
		raw, err := msgpack.Marshal(&b)
		if err != nil {
			s.log.Error("replica sync: encoding a batch", "err", err)
			continue
		}
		if err := pub.Send([]byte(Topic), raw); err != nil {
			return
		}
		s.st.sent.Add(uint64(len(b.Events)))
	}
}

// take swaps out the pending events and, with alive, the live set at the
// same point of the stream: a peer that applies the batch holds exactly
// this replica's live flights.
func (s *Sync) take(alive bool) batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := batch{Events: s.pending}
	s.pending = nil
	if alive {
		b.HasAlive = true
		b.Alive = make([]uint64, 0, len(s.ids)+len(s.places))
		for _, id := range s.ids {
			b.Alive = append(b.Alive, id)
		}
		for id := range s.places {
			b.Alive = append(b.Alive, id)
		}
	}
	return b
}

// add queues an event (under s.mu) and wakes the publisher.
func (s *Sync) add(e event) {
	if len(s.pending) >= maxPending {
		s.st.sendDropped.Add(1)
		return
	}
	s.pending = append(s.pending, e)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// observer is one model's load.Observer.
type observer struct {
	s     *Sync
	model string
}

func (o observer) Routed(fl *load.Flight, endpoint string, w load.Work, compute float64) {
	s := o.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	s.ids[fl] = s.nextID
	s.add(event{Kind: kindRouted, ID: s.nextID, Model: o.model, Endpoint: endpoint, Uncached: w.Uncached, Cached: w.Cached,
		UncachedBlocks: w.UncachedBlocks, Sequences: w.Sequences, Compute: compute, Opens: w.OpensConversation})
}

func (o observer) Decoding(fl *load.Flight, endpoint string) {
	o.s.send(fl, event{Kind: kindDecoding, Endpoint: endpoint}, false)
}

func (o observer) Prefilled(fl *load.Flight, observed bool) {
	k := kindPrefilled
	if observed {
		k = kindFirstToken
	}
	o.s.send(fl, event{Kind: k}, false)
}

func (o observer) Finished(fl *load.Flight) { o.s.send(fl, event{Kind: kindFinished}, true) }

// Place tells the peers that a request for a LoRA adapter takes its place
// in endpoint's batch (of model) until done is first called: the
// replica's own count (the gateway's LoRA batch places), which the peers
// count with theirs.
func (s *Sync) Place(model, endpoint, adapter string) (done func()) {
	if s.cfg.Bind == "" {
		return func() {}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	id := s.nextID
	s.places[id] = struct{}{}
	s.add(event{Kind: kindPlace, ID: id, Model: model, Endpoint: endpoint, Adapter: adapter})
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.places, id)
		s.add(event{Kind: kindUnplace, ID: id})
	})
}

// Prefix tells the peers that endpoint of model will hold keys (routed)
// or, withdrawn, will not: the replica's own notes in its index
// (kvindex.Index.Routed, Unrouted), which a peer's index otherwise lacks
// until the engine's KV events arrive, and a prompt queued behind others
// is not in them until its step is planned. The keys are copied.
func (s *Sync) Prefix(model, endpoint string, keys []uint64, routed bool) {
	if len(keys) == 0 || len(keys) > maxKeys || s.cfg.Bind == "" {
		return
	}
	k := kindPrefix
	if !routed {
		k = kindUnprefix
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(event{Kind: k, Model: model, Endpoint: endpoint, Keys: slices.Clone(keys)})
}

// Response tells the peers that endpoint of model made the Responses
// API answer id.
func (s *Sync) Response(model, endpoint, id string) {
	if id == "" || len(id) > maxResponseID || s.cfg.Bind == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(event{Kind: kindResponse, Model: model, Endpoint: endpoint, Response: id})
}

// send queues e for the live flight fl (forgotten with last).
func (s *Sync) send(fl *load.Flight, e event, last bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[fl]
	if !ok {
		return // routed before the sync began
	}
	if last {
		delete(s.ids, fl)
	}
	e.ID = id
	s.add(e)
}

// batch is one message.
type batch struct {
	_        struct{} `msgpack:",as_array"`
	Version  uint8
	Replica  uint64
	Events   []event
	HasAlive bool
	Alive    []uint64
	// Heartbeat is the sender's, in seconds (last: a replica of the
	// version before it skips it, and sends none: 0): a peer is silent
	// after three of the slower of the two.
	Heartbeat float64
	// BlockSize is the sender's router block size (0: not said).
	BlockSize int
}

// event is one flight's change.
type event struct {
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
	// Response is kindResponse's id (last: a replica of the version
	// before it reads the events it knows and skips this).
	Response string
}

// receive applies the peers' messages until ctx ends.
func (s *Sync) receive(ctx context.Context, sub *zmtp.Sub) {
	for {
		msg, err := sub.Recv(ctx)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, zmtp.ErrClosed) {
				s.log.Warn("replica sync: receiving", "err", err)
			}
			return
		}
		if len(msg) != 2 || string(msg[0]) != Topic {
			s.st.refused.Add(1)
			continue
		}
		var b batch
		if err := msgpack.Unmarshal(msg[1], &b); err != nil || b.Version != version || b.Replica == 0 {
			s.st.refused.Add(1)
			continue
		}
		if b.Replica == s.id {
			continue // its own address among the peers
		}
		s.apply(&b, time.Now())
	}
}

// apply applies one batch of a peer, heard at wall time now.
func (s *Sync) apply(b *batch, now time.Time) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	p := s.peers[b.Replica]
	if p == nil {
		if len(s.peers) >= MaxPeers {
			s.st.refused.Add(1)
			return
		}
		p = &peer{flights: map[uint64]peerFlight{}, places: map[uint64]func(){}}
		s.peers[b.Replica] = p
		s.log.Info("replica sync: a peer is heard", "replica", fmt.Sprintf("%016x", b.Replica))
	}
	p.heard = now
	if hb := time.Duration(b.Heartbeat * float64(time.Second)); hb >= minHeartbeat && hb <= maxHeartbeat {
		p.beat = hb
	}
	if b.BlockSize > 0 && b.BlockSize <= maxBlockSize {
		p.blockSize = b.BlockSize
	}
	at := s.clock()
	for i := range b.Events {
		s.st.received.Add(1)
		s.applyEvent(p, &b.Events[i], at)
	}
	if b.HasAlive {
		if len(b.Alive) > 2*MaxPeerFlights { // flights and places
			s.st.refused.Add(1)
			return
		}
		live := make(map[uint64]struct{}, len(b.Alive))
		for _, id := range b.Alive {
			live[id] = struct{}{}
		}
		for id, pf := range p.flights {
			if _, ok := live[id]; !ok {
				pf.fleet.Finish(pf.fl, at)
				delete(p.flights, id)
				s.held--
				s.st.byBeat.Add(1)
			}
		}
		for id, done := range p.places {
			if _, ok := live[id]; !ok {
				done()
				delete(p.places, id)
				s.held--
				s.st.byBeat.Add(1)
			}
		}
	}
}

// applyEvent applies one event of peer p at fleet time at (under pmu).
func (s *Sync) applyEvent(p *peer, e *event, at float64) {
	switch e.Kind {
	case kindRouted:
		s.route(p, e, at)
		return
	case kindPrefix, kindUnprefix:
		if s.otherBlocks(p) {
			s.st.ignored.Add(1)
			return
		}
		s.prefix(e)
		return
	case kindPlace:
		s.place(p, e)
		return
	case kindResponse:
		s.response(e)
		return
	case kindUnplace:
		done, ok := p.places[e.ID]
		if !ok {
			s.st.ignored.Add(1)
			return
		}
		done()
		delete(p.places, e.ID)
		s.held--
		s.st.applied.Add(1)
		return
	}
	pf, ok := p.flights[e.ID]
	if !ok {
		s.st.ignored.Add(1)
		return
	}
	switch e.Kind {
	case kindDecoding:
		d := pf.fleet.Endpoint(e.Endpoint)
		if d == nil {
			s.st.ignored.Add(1)
			return
		}
		pf.fleet.Decode(pf.fl, d)
	case kindPrefilled:
		pf.fleet.PrefillDone(pf.fl, at)
	case kindFirstToken:
		pf.fleet.FirstToken(pf.fl, at)
	case kindFinished:
		pf.fleet.Finish(pf.fl, at)
		delete(p.flights, e.ID)
		s.held--
	default:
		s.st.refused.Add(1)
		return
	}
	s.st.applied.Add(1)
}

// route loads a peer's new flight on the replica's fleet of its model.
func (s *Sync) route(p *peer, e *event, at float64) {
	if !validRoute(e) {
		s.st.refused.Add(1)
		return
	}
	if _, dup := p.flights[e.ID]; dup || len(p.flights) >= MaxPeerFlights || s.held >= s.maxHeld {
		s.st.refused.Add(1)
		return
	}
	f := s.local.LoadFleet(e.Model)
	if f == nil {
		s.ignoreUnknown(e)
		return
	}
	ep := f.Endpoint(e.Endpoint)
	if ep == nil {
		s.ignoreUnknown(e)
		return
	}
	fl := f.Route(ep, at, load.Work{Uncached: e.Uncached, Cached: e.Cached, UncachedBlocks: e.UncachedBlocks,
		PrefillSeconds: e.Compute, OpensConversation: e.Opens, Sequences: e.Sequences, Peer: true})
	p.flights[e.ID] = peerFlight{fleet: f, fl: fl}
	s.held++
	s.st.applied.Add(1)
}

// otherBlocks reports whether peer p keys prompts in blocks of another
// size than this replica (its prefix notes are then not applied), and
// warns of it once a peer: replicas configured with different
// --block-size share their loads but not their prefixes.
func (s *Sync) otherBlocks(p *peer) bool {
	if p.blockSize == 0 || s.cfg.BlockSize == 0 || p.blockSize == s.cfg.BlockSize {
		return false
	}
	if !p.warned {
		p.warned = true
		s.log.Warn("replica sync: a peer keys prompts in blocks of another size; its prefix notes are not applied (set the same block_size on every replica)",
			"peer_block_size", p.blockSize, "block_size", s.cfg.BlockSize)
	}
	return true
}

// ignoreUnknown counts a peer's flight on a model or endpoint this
// replica does not know, and warns of the names the first times: replicas
// that name a fleet's endpoints differently (one its engines' addresses,
// another name=) share nothing, and the count alone looked healthy.
func (s *Sync) ignoreUnknown(e *event) {
	s.st.ignored.Add(1)
	key := e.Model + "\x00" + e.Endpoint
	if s.unknown[key] || len(s.unknown) >= maxUnknownWarnings {
		return
	}
	if s.unknown == nil {
		s.unknown = map[string]bool{}
	}
	s.unknown[key] = true
	s.log.Warn("replica sync: a peer routes to an endpoint this replica does not have; replicas must name a fleet's endpoints alike (their name=, or the same discovery)",
		"model", e.Model, "endpoint", e.Endpoint)
}

// place counts a peer's adapter place on the replica's member.
func (s *Sync) place(p *peer, e *event) {
	if !validNames(e) || e.Adapter == "" || len(e.Adapter) > maxName {
		s.st.refused.Add(1)
		return
	}
	if _, dup := p.places[e.ID]; dup || len(p.places) >= MaxPeerFlights || s.held >= s.maxHeld {
		s.st.refused.Add(1)
		return
	}
	done, ok := s.local.Place(e.Model, e.Endpoint, e.Adapter)
	if !ok {
		s.st.ignored.Add(1)
		return
	}
	p.places[e.ID] = done
	s.held++
	s.st.applied.Add(1)
}

// prefix applies a peer's prefix note to the replica's index.
func (s *Sync) prefix(e *event) {
	if len(e.Keys) == 0 || len(e.Keys) > maxKeys || !validNames(e) {
		s.st.refused.Add(1)
		return
	}
	if !s.local.Prefix(e.Model, e.Endpoint, e.Keys, e.Kind == kindPrefix) {
		s.st.ignored.Add(1)
		return
	}
	s.st.applied.Add(1)
}

// response applies a peer's note of a Responses API answer's endpoint.
func (s *Sync) response(e *event) {
	if !validNames(e) || e.Response == "" || len(e.Response) > maxResponseID {
		s.st.refused.Add(1)
		return
	}
	if !s.local.Response(e.Model, e.Endpoint, e.Response) {
		s.st.ignored.Add(1)
		return
	}
	s.st.applied.Add(1)
}

func validNames(e *event) bool {
	return e.Model != "" && len(e.Model) <= maxName && e.Endpoint != "" && len(e.Endpoint) <= maxName
}

// validRoute checks a route's numbers and names against their ranges.
func validRoute(e *event) bool {
	inTokens := func(n int) bool { return n >= 0 && n < maxTokens }
	return inTokens(e.Uncached) && inTokens(e.Cached) && inTokens(e.UncachedBlocks) &&
		e.Sequences >= 0 && e.Sequences <= maxSequences &&
		!math.IsNaN(e.Compute) && e.Compute >= 0 && e.Compute <= maxCompute && validNames(e)
}

// endSilent ends every flight of the peers not heard for three heartbeats.
func (s *Sync) endSilent(now time.Time) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	at := s.clock()
	for id, p := range s.peers {
		if now.Sub(p.heard) >= silentBeats*max(s.cfg.Heartbeat, p.beat) {
			n := s.endPeer(id, p, at)
			s.st.bySilence.Add(uint64(n))
			s.log.Warn("replica sync: a peer fell silent; its requests in flight are ended", "replica", fmt.Sprintf("%016x", id),
				"silent", now.Sub(p.heard).Round(time.Millisecond), "ended", n)
		}
	}
}

// endAll ends every peer flight (Run is over: nothing will end them).
func (s *Sync) endAll() {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	at := s.clock()
	for id, p := range s.peers {
		s.endPeer(id, p, at)
	}
}

// endPeer ends peer id's flights at fleet time at, gives its adapter
// places up and forgets it (under pmu); it returns how many it ended.
func (s *Sync) endPeer(id uint64, p *peer, at float64) int {
	for _, pf := range p.flights {
		pf.fleet.Finish(pf.fl, at)
	}
	for _, done := range p.places {
		done()
	}
	n := len(p.flights) + len(p.places)
	s.held -= n
	delete(s.peers, id)
	return n
}
