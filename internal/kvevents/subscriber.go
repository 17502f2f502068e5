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
//     engine is identified by the topic "kv@<host:port>@<model>".
//
// Frames are [topic, seq (8 bytes big-endian), payload]; the payload is
// decoded by Decode (both vLLM forms). Per engine the subscriber tracks the
// sequence number: a gap is recovered from the engine's replay ROUTER (a
// DEALER sends ["", start_seq] and applies the replies up to the end
// marker); a sequence going back (restart) or AllBlocksCleared drops what
// that engine held. Engine block hashes are mapped to kvgate's chained keys
// from each BlockStored's token ids and parent (see mapper), so engine hash
// algorithms and block sizes do not matter. Malformed frames are counted
// and logged, never fatal.
package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/kvindex"
)

// Index is what the subscriber needs from the prefix index.
type Index interface {
	Sink
	AddEndpoint(name, model string) (kvindex.EndpointID, error)
	BlockSize() int
}

// EngineConfig names one engine and its event endpoints.
type EngineConfig struct {
	Name   string `yaml:"name" json:"name"`     // host:port of its HTTP API; the endpoint's name in the index
	Model  string `yaml:"model" json:"model"`   // served model
	Events string `yaml:"events" json:"events"` // its PUB endpoint to dial, e.g. tcp://10.0.0.5:5557; empty: none (central mode or no events)
	Replay string `yaml:"replay" json:"replay"` // its replay ROUTER endpoint; empty: no replay
}

// Config configures a Subscriber.
type Config struct {
	Engines []EngineConfig
	// BindEvents, when set, is a ZMQ endpoint (e.g. tcp://0.0.0.0:5557)
	// where kvgate binds a SUB that engines dial.
	BindEvents string
	// ReplayTimeout bounds the wait for each replay reply (default 2 s).
	ReplayTimeout time.Duration
	// MaxMapBlocks bounds each engine's engine→router map (default 2 Mi).
	MaxMapBlocks int
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
	byTopic map[string]*stream // central mode, by "name@model"

	// centralMalformed counts central-mode frames that name no engine.
	centralMalformed EngineStats
}

// New validates cfg and registers the configured engines in idx.
func New(cfg Config, idx Index) (*Subscriber, error) {
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.MaxMapBlocks <= 0 {
		cfg.MaxMapBlocks = 2 << 20
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
		s.byTopic[ec.Name+"@"+ec.Model] = st
	}
	return s, nil
}

func (s *Subscriber) newStream(ec EngineConfig) (*stream, error) {
	id, err := s.idx.AddEndpoint(ec.Name, ec.Model)
	if err != nil {
		return nil, fmt.Errorf("kvevents: register %s: %w", ec.Name, err)
	}
	st := &EngineStats{}
	st.lastSeq.Store(-1)
	str := &stream{
		cfg: ec, st: st, log: s.log,
		m: newMapper(id, ec.Model, s.idx.BlockSize(), s.cfg.MaxMapBlocks, s.idx, st),
	}
	if ec.Replay != "" {
		str.rep = &replayClient{endpoint: ec.Replay, timeout: s.cfg.ReplayTimeout, log: s.log}
	}
	s.mu.Lock()
	s.streams = append(s.streams, str)
	s.mu.Unlock()
	return str, nil
}

// Run receives events until ctx is done. It returns an error only when the
// central SUB cannot bind; connection problems are logged and retried.
func (s *Subscriber) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if s.cfg.BindEvents != "" {
		sock := zmq4.NewSub(ctx)
		if err := sock.Listen(s.cfg.BindEvents); err != nil {
			sock.Close()
			return fmt.Errorf("kvevents: bind %s: %w", s.cfg.BindEvents, err)
		}
		if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			sock.Close()
			return fmt.Errorf("kvevents: subscribe: %w", err)
		}
		s.log.Info("kv events: listening for engines", "bind", s.cfg.BindEvents)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer sock.Close()
			s.runCentral(ctx, sock)
		}()
	}
	s.mu.Lock()
	dial := append([]*stream(nil), s.streams...)
	s.mu.Unlock()
	for _, st := range dial {
		if st.cfg.Events == "" {
			continue
		}
		wg.Add(1)
		go func(st *stream) {
			defer wg.Done()
			s.runDial(ctx, st)
		}(st)
	}
	<-ctx.Done()
	wg.Wait()
	for _, st := range dial {
		if st.rep != nil {
			st.rep.close()
		}
	}
	return nil
}

// runDial keeps a SUB connected to one engine's PUB, reconnecting with
// backoff.
func (s *Subscriber) runDial(ctx context.Context, st *stream) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		sock := zmq4.NewSub(ctx, zmq4.WithDialerRetry(250*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
		err := sock.SetOption(zmq4.OptionSubscribe, "")
		if err == nil {
			err = sock.Dial(st.cfg.Events)
		}
		if err != nil {
			sock.Close()
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("kv events: dial failed", "endpoint", st.cfg.Name, "events", st.cfg.Events, "err", err)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		s.log.Info("kv events: subscribed", "endpoint", st.cfg.Name, "events", st.cfg.Events)
		st.st.connects.Add(1)
		backoff = 100 * time.Millisecond
		for {
			msg, err := sock.Recv()
			if err != nil {
				if ctx.Err() == nil {
					s.log.Info("kv events: connection lost, reconnecting", "endpoint", st.cfg.Name, "err", err)
				}
				break
			}
			st.onFrames(ctx, msg.Frames)
		}
		sock.Close()
		sleep(ctx, backoff)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// runCentral receives from every engine dialing the bound SUB.
func (s *Subscriber) runCentral(ctx context.Context, sock zmq4.Socket) {
	for ctx.Err() == nil {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// One engine disconnected; the socket keeps serving the rest.
			s.log.Debug("kv events: central receive", "err", err)
			if errors.Is(err, context.Canceled) {
				return
			}
			continue
		}
		f := msg.Frames
		if len(f) != 3 {
			s.centralBad(fmt.Errorf("%d frames, want [topic, seq, payload]", len(f)))
			continue
		}
		st, err := s.streamForTopic(string(f[0]))
		if err != nil {
			s.centralBad(err)
			continue
		}
		st.onFrames(ctx, f)
	}
}

func (s *Subscriber) centralBad(err error) {
	n := s.centralMalformed.malformed.Add(1)
	if n <= 10 || n%1000 == 0 {
		s.log.Warn("kv events: malformed central frame", "count", n, "err", err)
	}
}

// ParseTopic splits "kv@<host:port>@<model>" into name and model.
func ParseTopic(topic string) (name, model string, err error) {
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return "", "", fmt.Errorf("topic %q does not start with kv@", topic)
	}
	name, model, ok = strings.Cut(rest, "@")
	if !ok || name == "" || model == "" {
		return "", "", fmt.Errorf("topic %q is not kv@<host:port>@<model>", topic)
	}
	return name, model, nil
}

func (s *Subscriber) streamForTopic(topic string) (*stream, error) {
	name, model, err := ParseTopic(topic)
	if err != nil {
		return nil, err
	}
	key := name + "@" + model
	if st := s.byTopic[key]; st != nil {
		return st, nil
	}
	// An engine not in the configuration: register it (without replay).
	st, err := s.newStream(EngineConfig{Name: name, Model: model})
	if err != nil {
		return nil, err
	}
	s.log.Info("kv events: new engine from topic", "endpoint", name, "model", model)
	s.mu.Lock()
	s.byTopic[key] = st
	s.mu.Unlock()
	return st, nil
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

// CentralMalformed is the number of central-mode frames naming no engine.
func (s *Subscriber) CentralMalformed() int64 { return s.centralMalformed.malformed.Load() }
