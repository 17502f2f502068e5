// Package kvevents subscribes to vLLM-compatible KV-cache events and turns
// them into kvgate's prefix index entries.
//
// Two ways to receive events, usable together:
//
//   - per engine: a ZMQ SUB dials each engine's bound PUB endpoint (vLLM's
//     default, tcp://*:5557 on the engine); the engine is known from the
//     configuration;
//   - central: kvgate binds one SUB (Config.BindEvents) and engines dial it
//     (vLLM does this when its endpoint names a host rather than *); the
//     engine is identified by the topic "kv@<host:port>@<model>". A frame
//     whose topic is not of that form (vLLM's default topic is "") is
//     given to the configured engine without an events endpoint whose
//     name's host is the IP address the publisher dialed from, when
//     exactly one is; otherwise it is refused, counted and logged with the
//     vLLM setting that fixes it.
//
// Frames are [topic, seq (8 bytes big-endian), payload]; the payload is
// decoded by Decode (both vLLM forms). Per engine the subscriber tracks the
// sequence number: a gap is recovered from the engine's replay ROUTER (a
// DEALER sends ["", start_seq] and applies the replies up to the end
// marker); a sequence going back (restart) or AllBlocksCleared drops what
// that engine held. Replays are bounded: they stop at the live batch that
// revealed the gap, after the number of batches missing, or after
// Config.ReplayBudget, so a replay server cannot hold up live frames (they
// wait in the SUB socket meanwhile). Engine block hashes are mapped to kvgate's chained keys
// from each BlockStored's token ids and parent (see mapper), so engine hash
// algorithms and block sizes do not matter. Malformed frames are counted
// and logged, never fatal.
package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/zmtp"
)

// Defaults of Config.
const (
	DefaultReplayTimeout     = 2 * time.Second
	DefaultReplayBudget      = 10 * time.Second
	DefaultMaxMapBlocks      = 2 << 20
	DefaultMaxCentralEngines = 1024
	DefaultMaxMsgSize        = zmtp.DefaultMaxMsgSize
)

// Index is what the subscriber needs from the prefix index.
type Index interface {
	Sink
	AddEndpoint(name, model string) (kvindex.EndpointID, error)
	RemoveEndpoint(kvindex.EndpointID) error
	BlockSize() int
}

// EngineConfig names one engine and its event endpoints.
type EngineConfig struct {
	Name   string `yaml:"name" json:"name"`     // host:port of its HTTP API; the endpoint's name in the index
	Model  string `yaml:"model" json:"model"`   // served model
	Events string `yaml:"events" json:"events"` // its PUB endpoint to dial, e.g. tcp://10.0.0.5:5557; empty: none (central mode or no events)
	Replay string `yaml:"replay" json:"replay"` // its replay ROUTER endpoint; empty: no replay
	// Addr is host:port of its HTTP API when Name is not that (an
	// endpoint named by the user or after its pod): in central mode a
	// topic kv@<Addr>@<model>, and a connection from Addr's host, name it
	// as they would an engine named Addr.
	Addr string `yaml:"addr,omitempty" json:"addr,omitempty"`
}

// EngineFor is the subscriber's view of endpoint e: its name, model and
// event sockets, and its URL's host:port as Addr when e is named otherwise.
func EngineFor(e fleet.Endpoint) EngineConfig {
	ec := EngineConfig{Name: e.Name, Model: e.Model, Events: e.Events, Replay: e.Replay}
	if u, err := url.Parse(e.URL); err == nil && u.Host != "" && u.Host != e.Name {
		ec.Addr = u.Host
	}
	return ec
}

// aliasKey is the byTopic key ec's Addr gives it besides its name's (a
// rank NAME/dpR's is Addr/dpR's); "" when Addr is unset or its name.
func (ec EngineConfig) aliasKey() string {
	if ec.Addr == "" {
		return ""
	}
	a := ec.Addr
	if base, r := fleet.SplitRankName(ec.Name); base != ec.Name {
		a = fleet.RankName(ec.Addr, r)
	}
	if a == ec.Name {
		return ""
	}
	return a + "@" + ec.Model
}

// apiHost is the host of ec's HTTP API: Addr's, else its name's (a rank's
// without its rank), with the rank.
func (ec EngineConfig) apiHost() (host string, rank int, ok bool) {
	base, r := fleet.SplitRankName(ec.Name)
	if ec.Addr != "" {
		base = ec.Addr
	}
	h, _, err := net.SplitHostPort(base)
	return h, r, err == nil
}

// register makes st the stream of its engine's topics (under the lock): its
// name's, and its Addr's unless a configured engine holds that key (one
// named so, or another with the same Addr: the first keeps it); one
// registered from the wire before st was configured gives it up.
func (s *Subscriber) register(st *stream) {
	s.byTopic[st.cfg.Name+"@"+st.cfg.Model] = st
	if k := st.cfg.aliasKey(); k != "" {
		if cur := s.byTopic[k]; cur == nil || cur.fromWire {
			s.byTopic[k] = st
		}
	}
	if h, _, ok := st.cfg.apiHost(); ok {
		// A topic naming its host alone (streamForHost) registered from
		// the wire before st was configured: its next frame finds st.
		if k := h + "@" + st.cfg.Model; s.byTopic[k] != nil && s.byTopic[k].fromWire {
			delete(s.byTopic, k)
		}
	}
}

// unregister removes st's topics (under the lock): its name's, its
// Addr's and a host's its topic named (streamForHost).
func (s *Subscriber) unregister(st *stream) {
	for k, v := range s.byTopic {
		if v == st {
			delete(s.byTopic, k)
		}
	}
}

// Config configures a Subscriber.
type Config struct {
	Engines []EngineConfig
	// BindEvents, when set, is a ZMQ endpoint (e.g. tcp://0.0.0.0:5557)
	// where kvgate binds a SUB that engines dial.
	BindEvents string
	// BindRanks binds that many SUBs, at BindEvents' port + 0 …
	// BindRanks-1 (default 1): a data-parallel engine's rank R dials the
	// port + R, and what is heard there is rank R's (streamForTopic).
	BindRanks int
	// ReplayTimeout bounds the wait for each replay reply (default 2 s).
	ReplayTimeout time.Duration
	// ReplayBudget bounds one whole replay (default 10 s); live frames
	// wait in the socket meanwhile.
	ReplayBudget time.Duration
	// MaxMapBlocks bounds each engine's engine→router map (default 2 Mi).
	MaxMapBlocks int
	// MaxCentralEngines bounds the engines central mode registers from
	// topics it has not been configured with (default 1024); frames of
	// further topics are refused and counted. The central SUB accepts as
	// many connections as that plus the configured engines.
	MaxCentralEngines int
	// CentralEvictSilence: at MaxCentralEngines, an engine registered
	// from a topic silent this long gives its place to a new one
	// (default WireEvictSilence).
	CentralEvictSilence time.Duration
	// MaxMsgSize is the largest ZMQ message accepted, in bytes (default
	// 16 MiB, at most 1 GiB); a publisher sending more is disconnected.
	MaxMsgSize int64
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Subscriber receives KV events and writes them to an Index. Create with
// New, start with Run.
type Subscriber struct {
	cfg Config
	idx Index
	log *slog.Logger

	mu      sync.Mutex
	streams []*stream          // all streams, for Stats
	byTopic map[string]*stream // configured and central, by "name@model"
	// runCtx is Run's context while it runs (nil before): streams added
	// by SetEngines start at once under it.
	runCtx context.Context
	loops  sync.WaitGroup

	central        atomic.Pointer[zmtp.Sub] // the bound SUB (rank 0's), for Stats
	wireMu         sync.Mutex               // serialises registering engines from topics
	fromWire       int                      // engines registered from topics (under wireMu)
	centralRefused atomic.Int64             // frames of topics past MaxCentralEngines, or of a second feeder
	// centralUnidentified counts central-mode frames whose topic does not
	// name an engine and whose connection matches no single engine.
	centralUnidentified atomic.Int64
	// engineGen changes whenever the configured engines change, so that
	// the central goroutine's peer → stream cache is rebuilt.
	engineGen atomic.Uint64

	// centralMalformed counts central-mode frames that name no engine.
	centralMalformed EngineStats
}

// New validates cfg and registers the configured engines in idx.
func New(cfg Config, idx Index) (*Subscriber, error) {
	switch {
	case cfg.ReplayTimeout < 0 || cfg.ReplayBudget < 0:
		return nil, errors.New("kvevents: negative replay timeout")
	case cfg.MaxMapBlocks < 0 || cfg.MaxCentralEngines < 0:
		return nil, errors.New("kvevents: negative limit")
	case cfg.MaxMsgSize < 0 || cfg.MaxMsgSize > zmtp.MaxMsgSizeLimit:
		return nil, fmt.Errorf("kvevents: ZMQ message size %d out of range [1, %d]", cfg.MaxMsgSize, zmtp.MaxMsgSizeLimit)
	case cfg.BindRanks < 0 || cfg.BindRanks > fleet.MaxDPSize:
		return nil, fmt.Errorf("kvevents: bind ranks %d out of range [1, %d]", cfg.BindRanks, fleet.MaxDPSize)
	}
	cfg.BindRanks = max(cfg.BindRanks, 1)
	if cfg.BindEvents != "" && cfg.BindRanks > 1 {
		if _, err := fleet.OffsetPort(cfg.BindEvents, cfg.BindRanks-1); err != nil {
			return nil, fmt.Errorf("kvevents: bind ranks: %w", err)
		}
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.ReplayBudget == 0 {
		cfg.ReplayBudget = DefaultReplayBudget
	}
	if cfg.MaxMapBlocks == 0 {
		cfg.MaxMapBlocks = DefaultMaxMapBlocks
	}
	if cfg.MaxCentralEngines == 0 {
		cfg.MaxCentralEngines = DefaultMaxCentralEngines
	}
	if cfg.MaxMsgSize == 0 {
		cfg.MaxMsgSize = DefaultMaxMsgSize
	}
	if cfg.CentralEvictSilence <= 0 {
		cfg.CentralEvictSilence = WireEvictSilence
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Subscriber{cfg: cfg, idx: idx, log: cfg.Logger, byTopic: map[string]*stream{}}
	for _, ec := range cfg.Engines {
		if ec.Name == "" || ec.Model == "" {
			return nil, fmt.Errorf("kvevents: engine %+v needs a name and a model", ec)
		}
		st, err := s.newStream(ec)
		if err != nil {
			return nil, err
		}
		s.register(st)
	}
	return s, nil
}

func (s *Subscriber) newStream(ec EngineConfig) (*stream, error) {
	id, err := s.idx.AddEndpoint(ec.Name, ec.Model)
	if err != nil {
		return nil, fmt.Errorf("kvevents: register %s: %w", ec.Name, err)
	}
	st := &EngineStats{}
	str := &stream{
		cfg: ec, st: st, log: s.log,
		m:         newMapper(id, ec.Model, s.idx.BlockSize(), s.cfg.MaxMapBlocks, s.idx, st),
		connected: make(chan struct{}, 1),
	}
	if ec.Replay != "" {
		str.rep = &replayClient{
			endpoint: ec.Replay, timeout: s.cfg.ReplayTimeout, budget: s.cfg.ReplayBudget,
			maxMsg: s.cfg.MaxMsgSize, log: s.log,
		}
	}
	s.mu.Lock()
	s.streams = append(s.streams, str)
	s.mu.Unlock()
	return str, nil
}

// Run receives events until ctx is done. It returns an error only when the
// central SUB cannot bind or an endpoint is malformed; connection problems
// are logged and retried.
func (s *Subscriber) Run(ctx context.Context) error {
	var socks []*zmtp.Sub
	var loops []func()
	defer func() {
		for _, sock := range socks {
			sock.Close()
		}
	}()
	if s.cfg.BindEvents != "" {
		for r := range s.cfg.BindRanks {
			addr, _ := fleet.OffsetPort(s.cfg.BindEvents, r) // checked by New
			sock, err := s.bindCentral(addr)
			if err != nil {
				return err
			}
			if r == 0 {
				s.central.Store(sock)
			}
			socks = append(socks, sock)
			loops = append(loops, func() { s.runCentral(ctx, sock, r) })
		}
	}
	var wg sync.WaitGroup
	for _, loop := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop()
		}()
	}
	s.mu.Lock()
	s.runCtx = ctx
	streams := append([]*stream(nil), s.streams...)
	s.mu.Unlock()
	var startErr error
	for _, st := range streams {
		if err := s.startStream(ctx, st); err != nil && startErr == nil {
			startErr = err
		}
	}
	if startErr == nil {
		<-ctx.Done()
	}
	s.mu.Lock()
	s.runCtx = nil
	all := append([]*stream(nil), s.streams...)
	s.mu.Unlock()
	for _, st := range all {
		st.stop()
	}
	for _, sock := range socks {
		sock.Close()
	}
	wg.Wait()
	s.loops.Wait()
	return startErr
}

// bindCentral binds a central-mode SUB that engines dial, at addr,
// subscribed to every topic.
func (s *Subscriber) bindCentral(addr string) (*zmtp.Sub, error) {
	sock, err := zmtp.NewSub(zmtp.Options{
		MaxMsgSize: s.cfg.MaxMsgSize, MaxPeers: s.cfg.MaxCentralEngines + len(s.cfg.Engines), Logger: s.log,
		OnDisconnect: func(remote net.Addr, err error) {
			s.log.Debug("kv events: engine disconnected", "remote", remote.String(), "err", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	sock.Subscribe(nil)
	if _, err := sock.Bind(addr); err != nil {
		sock.Close()
		return nil, fmt.Errorf("kvevents: bind %s: %w", addr, err)
	}
	s.log.Info("kv events: listening for engines", "bind", addr)
	return sock, nil
}

// startStream dials one engine's PUB and receives from it until ctx ends
// or the stream is stopped (SetEngines removed the engine).
func (s *Subscriber) startStream(ctx context.Context, st *stream) error {
	if st.cfg.Events == "" {
		return nil
	}
	sock, err := s.dialSocket(st)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	st.stopMu.Lock()
	st.stopFn = func() {
		cancel()
		sock.Close()
		<-done
	}
	st.stopMu.Unlock()
	if st.rep == nil {
		s.loops.Add(1)
		go func() {
			defer s.loops.Done()
			defer close(done)
			for {
				msg, err := sock.Recv(ctx)
				if err != nil {
					return
				}
				st.onFrames(ctx, msg)
			}
		}()
		return nil
	}
	s.receiveWithReplay(ctx, st, sock, done)
	return nil
}

// receiveWithReplay runs the receive loop of a stream with a replay
// endpoint, which also hears the SUB's connections (onConnect): Recv
// blocks, so a goroutine of its own reads the frames.
func (s *Subscriber) receiveWithReplay(ctx context.Context, st *stream, sock *zmtp.Sub, done chan struct{}) {
	s.loops.Add(2)
	frames := make(chan [][]byte, 64)
	go func() {
		defer s.loops.Done()
		defer close(frames)
		for {
			msg, err := sock.Recv(ctx)
			if err != nil {
				return
			}
			select {
			case frames <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		defer s.loops.Done()
		defer close(done)
		for {
			select { // a connection first: its replay precedes its frames
			case <-st.connected:
				st.onConnect(ctx)
				continue
			default:
			}
			select {
			case <-st.connected:
				st.onConnect(ctx)
			case msg, ok := <-frames:
				if !ok {
					return
				}
				st.onFrames(ctx, msg)
			}
		}
	}()
}

// SetEngines replaces the configured engines while the subscriber runs
// (endpoint discovery): streams of engines no longer listed stop and have
// stopped when it returns; new ones start. An engine whose sockets changed
// restarts. Removing an engine's endpoint from the index is the caller's
// (it registered it, and may hold approximate entries of its own there).
// Engines registered from central-mode topics are kept.
func (s *Subscriber) SetEngines(engines []EngineConfig) error {
	want := make(map[string]EngineConfig, len(engines))
	for _, ec := range engines {
		if ec.Name == "" || ec.Model == "" {
			return fmt.Errorf("kvevents: engine %+v needs a name and a model", ec)
		}
		want[ec.Name+"@"+ec.Model] = ec
	}
	// Under wireMu, so that evictSilentWire never frees an index id a
	// new configured engine of the same name has just been given.
	s.wireMu.Lock()
	s.mu.Lock()
	var stopped, started []*stream
	keep := s.streams[:0:0]
	for _, st := range s.streams {
		key := st.cfg.Name + "@" + st.cfg.Model
		ec, ok := want[key]
		if st.fromWire || (ok && ec == st.cfg) {
			if st.fromWire && ok {
				st.adopted.Store(true) // configured now: never evicted
			}
			keep = append(keep, st)
			delete(want, key)
			continue
		}
		stopped = append(stopped, st)
		s.unregister(st)
	}
	s.streams = keep
	ctx := s.runCtx
	s.mu.Unlock()
	defer s.engineGen.Add(1)
	for _, st := range stopped {
		st.stop()
	}
	var errs []error
	for _, ec := range want {
		st, err := s.newStream(ec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		s.register(st)
		s.mu.Unlock()
		started = append(started, st)
	}
	s.wireMu.Unlock()
	if ctx != nil {
		for _, st := range started {
			if err := s.startStream(ctx, st); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// dialSocket starts a SUB dialing one engine's PUB; it reconnects with
// backoff by itself.
func (s *Subscriber) dialSocket(st *stream) (*zmtp.Sub, error) {
	name, ep := st.cfg.Name, st.cfg.Events
	sock, err := zmtp.NewSub(zmtp.Options{
		MaxMsgSize: s.cfg.MaxMsgSize, Logger: s.log,
		OnConnect: func(net.Addr) {
			st.st.connects.Add(1)
			s.log.Info("kv events: subscribed", "endpoint", name, "events", ep)
			if st.rep != nil {
				select { // the receive loop asks the replay (onConnect)
				case st.connected <- struct{}{}:
				default: // one waiting already
				}
			}
		},
		OnDisconnect: func(_ net.Addr, err error) {
			if err != nil { // nil: we are closing
				s.log.Info("kv events: connection lost, reconnecting", "endpoint", name, "err", err)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	sock.Subscribe(nil)
	if err := sock.Dial(ep); err != nil {
		sock.Close()
		return nil, fmt.Errorf("kvevents: engine %s: %w", name, err)
	}
	st.sock.Store(sock)
	return sock, nil
}

// runCentral receives from every engine dialing the bound SUB of
// data-parallel rank rank (0: the engines without ranks too).
func (s *Subscriber) runCentral(ctx context.Context, sock *zmtp.Sub, rank int) {
	peers := peerCache{}
	for {
		f, from, err := sock.RecvFrom(ctx)
		if err != nil {
			return
		}
		if len(f) != 3 {
			s.centralBad(fmt.Errorf("%d frames, want [topic, seq, payload]", len(f)))
			continue
		}
		st, err := s.streamForTopic(string(f[0]), rank)
		if errors.Is(err, errNotKVTopic) {
			st, err = s.streamForPeer(&peers, string(f[0]), from, rank), nil
		}
		if err != nil {
			s.centralBad(err)
			continue
		}
		if st != nil && s.fedBy(sock, st, from) {
			st.onFrames(ctx, f)
		}
	}
}

// fedBy reports whether the frames of connection from may feed st: the
// first connection to send its frames does, and another only once that
// one is gone (an engine that restarted dials again). Two connections at
// once publishing as one endpoint (two engines whose topics name it, or
// a second engine on its host) mixed their blocks in its map and took
// each other's sequence numbers for restarts; the second is refused,
// counted in CentralRefused and logged once while the first feeds it.
func (s *Subscriber) fedBy(sock *zmtp.Sub, st *stream, from net.Addr) bool {
	switch {
	// A connection's frames carry one address value (zmtp's), so the
	// feeder's are known without formatting two strings a frame.
	case from == nil || st.feeder == nil || from == st.feeder:
	case sock.Connected(st.feeder):
		if n := s.centralRefused.Add(1); st.refusedFrom != from.String() {
			st.refusedFrom = from.String()
			s.log.Error("kv events: a second connection publishes as an endpoint another connection feeds; its frames are refused (two engines whose topics name one endpoint, or two engines on one host?)",
				"endpoint", st.cfg.Name, "feeding", st.feeder.String(), "refused", from.String(), "refused_frames", n)
		}
		return false
	}
	st.newFeeder = st.newFeeder || (from != nil && st.feeder != nil && from != st.feeder)
	st.feeder, st.refusedFrom = from, ""
	return true
}

// peerCache is the central goroutine's memory of which stream a
// connection's frames without a kv@ topic go to (nil: none).
type peerCache struct {
	gen    uint64
	byAddr map[string]*stream
}

// maxPeerCache bounds peerCache (reconnects bring new source ports).
const maxPeerCache = 4096

// streamForPeer identifies the publisher of a frame whose topic names no
// engine by the connection it came from: the configured engine without an
// events endpoint whose name's host is the peer's IP, if exactly one is.
// Otherwise the frame is refused and counted, and the first refusal per
// connection is logged with what to change.
func (s *Subscriber) streamForPeer(pc *peerCache, topic string, from net.Addr, rank int) *stream {
	if gen := s.engineGen.Load(); pc.byAddr == nil || pc.gen != gen || len(pc.byAddr) >= maxPeerCache {
		pc.gen, pc.byAddr = gen, map[string]*stream{}
	}
	addr := "unknown"
	if from != nil {
		addr = from.String()
	}
	if st, ok := pc.byAddr[addr]; ok {
		if st == nil {
			s.unidentified(false, topic, addr, nil)
		}
		return st
	}
	var ip net.IP
	if ta, ok := from.(*net.TCPAddr); ok {
		ip = ta.IP
	}
	var match []*stream
	s.mu.Lock()
	for _, st := range s.streams {
		if st.fromWire || st.cfg.Events != "" || ip == nil {
			continue
		}
		if host, r, ok := st.cfg.apiHost(); ok && r == rank && ip.Equal(net.ParseIP(host)) {
			match = append(match, st)
		}
	}
	s.mu.Unlock()
	var st *stream
	if len(match) == 1 && match[0].claim(rank) {
		st = match[0]
		s.log.Info("kv events: engine identified by its connection (its topic does not name it)",
			"endpoint", st.cfg.Name, "model", st.cfg.Model, "remote", addr, "topic", topic)
	} else {
		s.unidentified(true, topic, addr, match)
	}
	pc.byAddr[addr] = st
	return st
}

// unidentified counts a refused frame and logs the first of each
// connection (first) and every 1000th.
func (s *Subscriber) unidentified(first bool, topic, addr string, match []*stream) {
	n := s.centralUnidentified.Add(1)
	if !first && n%1000 != 0 {
		return
	}
	names := make([]string, len(match))
	for i, st := range match {
		names[i] = st.cfg.Name + "@" + st.cfg.Model
	}
	s.log.Error("kv events: frames refused: their topic does not name the engine and the connection matches "+
		fmt.Sprint(len(match))+" configured engines; set the topic in vLLM, e.g. --kv-events-config "+
		`'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://<kvgate>:<port>", "topic": "kv@<host:port>@<model>"}'`+
		" (host:port of its HTTP API), or configure exactly one engine named <its IP>:<port> without events",
		"topic", topic, "remote", addr, "candidates", names, "refused_frames", n)
}

func (s *Subscriber) centralBad(err error) {
	n := s.centralMalformed.malformed.Add(1)
	if n <= 10 || n%1000 == 0 {
		s.log.Warn("kv events: malformed central frame", "count", n, "err", err)
	}
}

// errNotKVTopic: the topic does not follow the kv@ convention at all (as
// vLLM's default, empty, topic); the engine is looked for by connection.
var errNotKVTopic = errors.New("topic does not start with kv@")

// ParseTopic splits "kv@<host:port>@<model>" into name and model.
func ParseTopic(topic string) (name, model string, err error) {
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return "", "", fmt.Errorf("topic %q: %w", topic, errNotKVTopic)
	}
	name, model, ok = strings.Cut(rest, "@")
	if !ok || name == "" || model == "" {
		return "", "", fmt.Errorf("topic %q is not kv@<host:port>@<model>", topic)
	}
	return name, model, nil
}

// streamForTopic finds (or, within the limit, registers) the stream of the
// engine a kv@ topic names, heard on the SUB of data-parallel rank rank:
// the endpoint NAME/dpR when there is one (an engine of ranks behind one
// API, whose ranks all send its one topic), else NAME (ranks with APIs of
// their own, whose topics name them) unless another rank's SUB feeds it,
// in which case the rank is registered as NAME/dpR. A stream is fed by
// one SUB only (stream.claim).
func (s *Subscriber) streamForTopic(topic string, rank int) (*stream, error) {
	name, model, err := ParseTopic(topic)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	st := s.byTopic[fleet.RankName(name, rank)+"@"+model]
	if st == nil {
		// The topic names the rank's own endpoint (ranks of their own
		// HTTP API, or no ranks): it, unless another rank's SUB feeds it
		// (one topic for all ranks: the rank then is NAME/dpR).
		if st = s.byTopic[name+"@"+model]; st != nil && !st.claim(rank) {
			st = nil
		}
	}
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	// An engine not in the configuration: register it (without replay),
	// within the limit. The central goroutines (one a rank) register one
	// at a time.
	s.wireMu.Lock()
	defer s.wireMu.Unlock()
	s.mu.Lock()
	if s.byTopic[name+"@"+model] != nil {
		name = fleet.RankName(name, rank) // NAME is another rank's
	}
	key := name + "@" + model
	st = s.byTopic[key]
	taken := st != nil && !st.claim(rank)
	s.mu.Unlock()
	if taken { // NAME/dpR fed by another rank's SUB: refuse
		s.centralBad(fmt.Errorf("topic %q at rank %d: its endpoint %s is fed by another rank's socket", topic, rank, name))
		return nil, nil
	}
	if st != nil {
		return st, nil
	}
	if base, _ := fleet.SplitRankName(name); !hostPort(base) {
		// llm-d's vLLM deployments name the pod by its IP alone
		// (kv@${POD_IP}@MODEL): the configured engine of that model
		// whose API is at that host, when it is the only one.
		if st, err := s.streamForHost(base, model, rank, topic); st != nil || err != nil {
			return st, err
		}
	}
	if s.fromWire >= s.cfg.MaxCentralEngines && !s.evictSilentWire(rank) {
		n := s.centralRefused.Add(1)
		if n <= 10 || n%1000 == 0 {
			s.log.Warn("kv events: frame refused: limit of engines registered from topics reached (raise --max-central-engines or configure the engine)",
				"topic", topic, "limit", s.cfg.MaxCentralEngines, "refused_frames", n)
		}
		return nil, nil
	}
	s.fromWire++
	st, err = s.newStream(EngineConfig{Name: name, Model: model})
	if err != nil {
		return nil, err
	}
	st.fromWire = true
	st.lastFrame.Store(time.Now().UnixNano())
	st.claim(rank)
	s.log.Info("kv events: new engine from topic", "endpoint", name, "model", model)
	s.mu.Lock()
	s.byTopic[key] = st
	s.mu.Unlock()
	return st, nil
}

// WireEvictSilence is how long an engine registered from a topic must
// have been silent before a new engine's topic may take its place at
// MaxCentralEngines (evictSilentWire; Config.CentralEvictSilence).
const WireEvictSilence = time.Minute

// evictSilentWire makes room, at MaxCentralEngines, for an engine heard
// on rank's central SUB: the engine registered from topics on that SUB
// (so the caller's goroutine is the one that applies its frames: none is
// being applied) silent longest, if for at least CentralEvictSilence, is
// forgotten with its blocks (a pod gone: each restart of llm-d's pods
// brings a new IP, so a topic-named engine that went silent rarely
// speaks again). One configured since under its name (adopted) is kept.
// Under wireMu.
func (s *Subscriber) evictSilentWire(rank int) bool {
	s.mu.Lock()
	var old *stream
	for _, st := range s.streams {
		if !st.fromWire || st.adopted.Load() || st.centralRank.Load() != int32(rank)+1 || s.byTopic[st.cfg.Name+"@"+st.cfg.Model] != st {
			continue
		}
		if old == nil || st.lastFrame.Load() < old.lastFrame.Load() {
			old = st
		}
	}
	if old == nil || time.Since(time.Unix(0, old.lastFrame.Load())) < s.cfg.CentralEvictSilence {
		s.mu.Unlock()
		return false
	}
	s.unregister(old)
	s.streams = slices.DeleteFunc(s.streams, func(st *stream) bool { return st == old })
	s.mu.Unlock()
	if err := s.idx.RemoveEndpoint(old.m.ep); err != nil {
		s.log.Warn("kv events: forgetting a silent engine", "endpoint", old.cfg.Name, "err", err)
	}
	s.fromWire--
	s.log.Info("kv events: engine registered from its topic forgotten with its blocks, to make room for a new one (--max-central-engines)",
		"endpoint", old.cfg.Name, "model", old.cfg.Model, "silent", time.Since(time.Unix(0, old.lastFrame.Load())).Round(time.Second))
	return true
}

// streamForHost finds the configured engine of model at rank whose API's
// host is host (a topic that names no port), and makes the topic's key
// its alias; nil when none is; an error when several are (the topic
// cannot tell them apart).
func (s *Subscriber) streamForHost(host, model string, rank int, topic string) (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var match []*stream
	for _, st := range s.streams {
		if h, r, ok := st.cfg.apiHost(); ok && !st.fromWire && st.cfg.Model == model && r == rank && h == host {
			match = append(match, st)
		}
	}
	switch {
	case len(match) == 0:
		return nil, nil
	case len(match) > 1 || !match[0].claim(rank):
		return nil, fmt.Errorf("topic %q names host %s without a port, and %d configured engines of model %s are there: give each engine's topic its port (kv@HOST:PORT@MODEL)", topic, host, len(match), model)
	}
	s.byTopic[fleet.RankName(host, rank)+"@"+model] = match[0]
	s.log.Info("kv events: engine identified by the host its topic names", "endpoint", match[0].cfg.Name, "model", model, "topic", topic)
	return match[0], nil
}

// hostPort reports whether name is a host:port.
func hostPort(name string) bool {
	host, port, err := net.SplitHostPort(name)
	return err == nil && host != "" && port != ""
}

// Stats returns every engine stream's counters, sorted by endpoint name.
func (s *Subscriber) Stats() []EngineSnapshot {
	s.mu.Lock()
	streams := append([]*stream(nil), s.streams...)
	s.mu.Unlock()
	out := make([]EngineSnapshot, 0, len(streams))
	for _, st := range streams {
		sn := st.st.snapshot()
		sn.Endpoint, sn.Model, sn.Events, sn.Replay = st.cfg.Name, st.cfg.Model, st.cfg.Events, st.cfg.Replay
		if sock := st.sock.Load(); sock != nil {
			zs := sock.Stats()
			zs.PeerStats = nil
			sn.ZMQ = &zs
		}
		out = append(out, sn)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Endpoint != out[j].Endpoint {
			return out[i].Endpoint < out[j].Endpoint
		}
		return out[i].Model < out[j].Model
	})
	return out
}

// Resync asks the replay endpoint of the central-mode engine called name
// whether it still continues what the index applied of it (resync: the
// same last batch, by its payload's hash), when something outside the
// event stream says it may have restarted: its health checks took it out
// and brought it back. In central mode the engine dials kvgate and sends
// nothing until its next batch, so a restart was seen only then, its old
// blocks claimed meanwhile. A no-op for other engines (per-engine mode
// asks at every reconnection), without a replay endpoint, or before its
// first batch.
func (s *Subscriber) Resync(name string) {
	s.mu.Lock()
	ctx := s.runCtx
	var st *stream
	for _, c := range s.streams {
		if c.cfg.Name == name {
			st = c
		}
	}
	s.mu.Unlock()
	if ctx == nil || st == nil || st.cfg.Events != "" || st.rep == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.started && !st.past {
		st.resync(ctx)
	}
}

// CentralMalformed is the number of central-mode frames naming no engine.
func (s *Subscriber) CentralMalformed() int64 { return s.centralMalformed.malformed.Load() }

// CentralRefused is the number of central-mode frames refused because
// their topic would register an engine past MaxCentralEngines, or because
// another connection feeds the endpoint they name (fedBy).
func (s *Subscriber) CentralRefused() int64 { return s.centralRefused.Load() }

// CentralUnidentified is the number of central-mode frames refused because
// their topic does not name an engine (vLLM's default topic is "") and
// their connection's IP matches no single configured engine.
func (s *Subscriber) CentralUnidentified() int64 { return s.centralUnidentified.Load() }

// CentralSocketStats are the central SUB's counters (zero before Run binds
// it; rank 0's when BindRanks binds several), without the per-peer list.
func (s *Subscriber) CentralSocketStats() zmtp.Stats {
	sock := s.central.Load()
	if sock == nil {
		return zmtp.Stats{}
	}
	st := sock.Stats()
	st.PeerStats = nil
	return st
}
