package kvpub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// EndSeq is the sequence number of the replay end marker (-1, all bits set).
const EndSeq = ^uint64(0)

// DefaultBufferSteps is the replay buffer size vLLM uses by default.
const DefaultBufferSteps = 10000

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
	// BufferSteps bounds the replay buffer (batches); 0 means
	// DefaultBufferSteps.
	BufferSteps int
	// Logger receives errors; nil means slog.Default().
	Logger *slog.Logger
}

type batch struct {
	seq     uint64
	payload []byte
}

// Publisher sends event batches on a ZMQ PUB socket and serves replays. It
// is safe for concurrent use.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	seq  uint64
	ring []batch // circular, len <= BufferSteps
	head int     // index of the oldest batch when the ring is full
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
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	p := &Publisher{cfg: cfg, log: lg, cancel: cancel}
	p.pub = zmq4.NewPub(ctx, quiet)
	if err := p.pub.Listen(normalizeEndpoint(cfg.Endpoint)); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kvpub: bind PUB %s: %w", cfg.Endpoint, err)
	}
	p.cfg.Endpoint = boundEndpoint(cfg.Endpoint, p.pub.Addr())
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, quiet)
		if err := p.router.Listen(normalizeEndpoint(cfg.ReplayEndpoint)); err != nil {
			cancel()
			p.pub.Close()
			p.router.Close()
			return nil, fmt.Errorf("kvpub: bind ROUTER %s: %w", cfg.ReplayEndpoint, err)
		}
		p.cfg.ReplayEndpoint = boundEndpoint(cfg.ReplayEndpoint, p.router.Addr())
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
	payload, err := EncodeBatch(p.cfg.Format, ts, events)
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
	// Send under the lock so sequence numbers leave in order.
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	err = p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqb[:], payload))
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

func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Debug("kv replay: receive", "err", err)
			continue
		}
		// ROUTER prepends the peer identity: [id, "", start_seq].
		if len(msg.Frames) < 3 || len(msg.Frames[len(msg.Frames)-1]) != 8 {
			p.log.Warn("kv replay: malformed request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[len(msg.Frames)-1])
		topic := []byte(p.cfg.Topic)
		for _, b := range p.buffered(start) {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], b.seq)
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, topic, seqb[:], b.payload)); err != nil {
				p.log.Warn("kv replay: send", "err", err)
				break
			}
		}
		var end [8]byte
		binary.BigEndian.PutUint64(end[:], EndSeq)
		if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, topic, end[:], nil)); err != nil {
			p.log.Warn("kv replay: send end marker", "err", err)
		}
	}
}

// Close closes the sockets and stops the replay service.
func (p *Publisher) Close() error {
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	p.wg.Wait()
	return err
}
