package kvpub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp"
)

// EndSeq is the sequence number of the replay end marker (-1, all bits set).
const EndSeq = ^uint64(0)

// DefaultBufferSteps is the replay buffer size vLLM uses by default.
const DefaultBufferSteps = 10000

// Defaults of the socket limits in Config.
const (
	DefaultSendQueue        = 1000
	DefaultMaxSubscribers   = 256
	DefaultMaxReplayClients = 64
	DefaultWriteTimeout     = 10 * time.Second
)

// What peers may send: subscriptions to the PUB, ["", start_seq] requests
// to the ROUTER. Anything larger is refused before it is read.
const (
	maxSubscriptionMsg = 64 << 10
	maxReplayRequest   = 4 << 10
)

// Config configures a Publisher.
type Config struct {
	// Endpoint is where the PUB socket binds, e.g. tcp://127.0.0.1:5557 or
	// tcp://*:5557. Port 0 picks a free port (see Publisher.Endpoint).
	Endpoint string
	// ReplayEndpoint, when set, binds a ROUTER socket serving replays.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// Format is the event encoding.
	Format Format
	// Style is vLLM's (default) or llm-d-inference-sim's numbering and
	// chain starts.
	Style Style
	// BufferSteps bounds the replay buffer (batches); 0 means
	// DefaultBufferSteps.
	BufferSteps int
	// SendQueue is each subscriber's and each replay client's queue, in
	// batches (0: DefaultSendQueue). A subscriber further behind misses
	// batches (counted per subscriber; it can recover them by replay); a
	// replay waits for its client.
	SendQueue int
	// MaxSubscribers and MaxReplayClients bound the connections each
	// socket holds (0: DefaultMaxSubscribers, DefaultMaxReplayClients).
	MaxSubscribers, MaxReplayClients int
	// WriteTimeout disconnects a subscriber or replay client that accepts
	// nothing for this long (0: DefaultWriteTimeout).
	WriteTimeout time.Duration
	// Logger receives errors; nil means slog.Default().
	Logger *slog.Logger
}

type batch struct {
	seq     uint64
	payload []byte
}

// Stats are the publisher's socket counters.
type Stats struct {
	PUB         zmtp.Stats `json:"pub"`
	Replay      zmtp.Stats `json:"replay"`
	Replays     uint64     `json:"replays"`      // replay requests served
	ReplaysBusy uint64     `json:"replays_busy"` // requests ignored: that client's previous replay still running
}

// Publisher sends event batches on a ZMQ PUB socket and serves replays. It
// is safe for concurrent use.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	topic  []byte
	pub    *zmtp.Pub
	router *zmtp.Router // nil without replay
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	seq  uint64
	ring []batch // circular, len <= BufferSteps
	head int     // index of the oldest batch when the ring is full

	replayMu                sync.Mutex
	replaying               map[string]bool // routing ids with a replay running
	replays, replaysBusy    atomic.Uint64
	malformedReplayRequests atomic.Uint64
}

// normalizeEndpoint maps ZMQ's wildcard host to Go's.
func normalizeEndpoint(ep string) string {
	return strings.Replace(ep, "://*:", "://0.0.0.0:", 1)
}

func boundEndpoint(ep string, addr net.Addr) string {
	if addr == nil {
		return ep
	}
	if i := strings.Index(ep, "://"); i >= 0 {
		return ep[:i+3] + addr.String()
	}
	return ep
}

// New binds the sockets and starts the replay service.
func New(ctx context.Context, cfg Config) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kvpub: endpoint is required")
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.SendQueue, DefaultSendQueue)
	def(&cfg.MaxSubscribers, DefaultMaxSubscribers)
	def(&cfg.MaxReplayClients, DefaultMaxReplayClients)
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	p := &Publisher{cfg: cfg, log: lg, topic: []byte(cfg.Topic), seq: cfg.Style.firstSeq(), replaying: map[string]bool{}}
	var err error
	p.pub, err = zmtp.NewPub(zmtp.Options{
		MaxMsgSize: maxSubscriptionMsg, MaxFrames: 1, MaxPeers: cfg.MaxSubscribers,
		SendQueue: cfg.SendQueue, WriteTimeout: cfg.WriteTimeout, Logger: lg,
	})
	if err != nil {
		return nil, fmt.Errorf("kvpub: %w", err)
	}
	addr, err := p.pub.Bind(normalizeEndpoint(cfg.Endpoint))
	if err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("kvpub: bind PUB %s: %w", cfg.Endpoint, err)
	}
	p.cfg.Endpoint = boundEndpoint(cfg.Endpoint, addr)
	ctx, p.cancel = context.WithCancel(ctx)
	if cfg.ReplayEndpoint != "" {
		p.router, err = zmtp.NewRouter(zmtp.Options{
			MaxMsgSize: maxReplayRequest, MaxFrames: 4, MaxPeers: cfg.MaxReplayClients,
			SendQueue: cfg.SendQueue, WriteTimeout: cfg.WriteTimeout, Logger: lg,
		})
		if err == nil {
			addr, err = p.router.Bind(normalizeEndpoint(cfg.ReplayEndpoint))
			if err != nil {
				p.router.Close()
			}
		}
		if err != nil {
			p.cancel()
			p.pub.Close()
			return nil, fmt.Errorf("kvpub: bind ROUTER %s: %w", cfg.ReplayEndpoint, err)
		}
		p.cfg.ReplayEndpoint = boundEndpoint(cfg.ReplayEndpoint, addr)
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	return p, nil
}

// Endpoint is the bound PUB endpoint (with the real port if 0 was asked).
func (p *Publisher) Endpoint() string { return p.cfg.Endpoint }

// ReplayEndpoint is the bound ROUTER endpoint, or "".
func (p *Publisher) ReplayEndpoint() string { return p.cfg.ReplayEndpoint }

// Topic is the topic frame of every message.
func (p *Publisher) Topic() string { return p.cfg.Topic }

// Format is the event encoding in use.
func (p *Publisher) Format() Format { return p.cfg.Format }

// Publish encodes events as one batch, sends it with the next sequence
// number and keeps it for replay. It does not block on slow subscribers.
func (p *Publisher) Publish(ts float64, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	payload, err := EncodeBatch(p.cfg.Format, p.cfg.Style, ts, events)
	if err != nil {
		return err
	}
	p.mu.Lock()
	seq := p.seq
	p.seq++
	b := batch{seq: seq, payload: payload}
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, b)
	} else {
		p.ring[p.head] = b
		p.head = (p.head + 1) % len(p.ring)
	}
	// Send under the lock so sequence numbers leave in order. Send never
	// blocks: a subscriber whose queue is full misses the batch.
	err = p.pub.Send(p.topic, binary.BigEndian.AppendUint64(nil, seq), payload)
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kvpub: send batch %d: %w", seq, err)
	}
	return nil
}

// Seq is the sequence number the next batch will carry.
func (p *Publisher) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// buffered returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) buffered(start uint64) []batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]batch, 0, len(p.ring))
	for i := range p.ring {
		b := p.ring[(p.head+i)%len(p.ring)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// Stats returns the socket counters.
func (p *Publisher) Stats() Stats {
	st := Stats{PUB: p.pub.Stats(), Replays: p.replays.Load(), ReplaysBusy: p.replaysBusy.Load()}
	if p.router != nil {
		st.Replay = p.router.Stats()
	}
	return st
}

// serveReplay answers replay requests, each in a goroutine of its own (one
// at a time per client), so a client that does not read holds up only its
// own replay, until the write timeout disconnects it.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv(ctx)
		if err != nil {
			return // closed
		}
		// ROUTER prepends the peer identity: [id, "", start_seq].
		if len(msg) < 3 || len(msg[len(msg)-1]) != 8 {
			n := p.malformedReplayRequests.Add(1)
			if n <= 10 || n%1000 == 0 {
				p.log.Warn("kv replay: malformed request", "frames", len(msg), "count", n)
			}
			continue
		}
		id := string(msg[0])
		start := binary.BigEndian.Uint64(msg[len(msg)-1])
		p.replayMu.Lock()
		busy := p.replaying[id]
		p.replaying[id] = true
		p.replayMu.Unlock()
		if busy {
			p.replaysBusy.Add(1)
			continue
		}
		p.replays.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.replay(ctx, msg[0], start)
			p.replayMu.Lock()
			delete(p.replaying, id)
			p.replayMu.Unlock()
		}()
	}
}

// replay sends one client every buffered batch from start on, then the end
// marker.
func (p *Publisher) replay(ctx context.Context, id []byte, start uint64) {
	for _, b := range p.buffered(start) {
		err := p.router.Send(ctx, id, nil, p.topic, binary.BigEndian.AppendUint64(nil, b.seq), b.payload)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Debug("kv replay: send", "err", err)
			}
			return
		}
	}
	if err := p.router.Send(ctx, id, nil, p.topic, binary.BigEndian.AppendUint64(nil, EndSeq), nil); err != nil && ctx.Err() == nil {
		p.log.Debug("kv replay: send end marker", "err", err)
	}
}

// Close closes the sockets and stops the replay service.
func (p *Publisher) Close() error {
	p.cancel()
	var err error
	if p.router != nil {
		err = p.router.Close()
	}
	p.wg.Wait()
	return errors.Join(err, p.pub.Close())
}
