package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// EngineStats are one engine stream's counters; read them with Snapshot.
type EngineStats struct {
	batches, events, storedBlocks, removedBlocks, clears    atomic.Int64
	unknownEvents, badEvents, orphans, unknownRemoves       atomic.Int64
	mapEvicted, gaps, replays, replayedBatches, unrecovered atomic.Int64
	replayFailures, restarts, malformed, duplicates         atomic.Int64
	lastSeq, connects                                       atomic.Int64
	mapSize                                                 atomic.Int64
}

// EngineSnapshot is a copy of one engine's counters, as served by the admin
// API.
type EngineSnapshot struct {
	Endpoint        string `json:"endpoint"`
	Model           string `json:"model"`
	Events          string `json:"events,omitempty"`
	Replay          string `json:"replay,omitempty"`
	LastSeq         int64  `json:"last_seq"` // -1 before the first batch
	Connects        int64  `json:"connects"` // successful dials of its PUB (per-engine mode)
	Batches         int64  `json:"batches"`
	EventsSeen      int64  `json:"events_seen"`
	StoredBlocks    int64  `json:"stored_blocks"`
	RemovedBlocks   int64  `json:"removed_blocks"`
	Clears          int64  `json:"clears"`
	Gaps            int64  `json:"gaps"`
	Replays         int64  `json:"replays"`
	ReplayedBatches int64  `json:"replayed_batches"`
	ReplayFailures  int64  `json:"replay_failures"`
	Unrecovered     int64  `json:"unrecovered_gaps"`
	Duplicates      int64  `json:"duplicates"`
	Restarts        int64  `json:"restarts"`
	Malformed       int64  `json:"malformed_frames"`
	BadEvents       int64  `json:"bad_events"`
	UnknownEvents   int64  `json:"unknown_events"`
	OrphanBlocks    int64  `json:"orphan_blocks"`
	UnknownRemoves  int64  `json:"unknown_removes"`
	MapBlocks       int64  `json:"map_blocks"`
	MapEvicted      int64  `json:"map_evicted"`
}

func (s *EngineStats) snapshot() EngineSnapshot {
	return EngineSnapshot{
		LastSeq: s.lastSeq.Load(), Connects: s.connects.Load(), Batches: s.batches.Load(), EventsSeen: s.events.Load(),
		StoredBlocks: s.storedBlocks.Load(), RemovedBlocks: s.removedBlocks.Load(), Clears: s.clears.Load(),
		Gaps: s.gaps.Load(), Replays: s.replays.Load(), ReplayedBatches: s.replayedBatches.Load(),
		ReplayFailures: s.replayFailures.Load(), Unrecovered: s.unrecovered.Load(), Duplicates: s.duplicates.Load(),
		Restarts: s.restarts.Load(), Malformed: s.malformed.Load(), BadEvents: s.badEvents.Load(),
		UnknownEvents: s.unknownEvents.Load(), OrphanBlocks: s.orphans.Load(), UnknownRemoves: s.unknownRemoves.Load(),
		MapBlocks: s.mapSize.Load(), MapEvicted: s.mapEvicted.Load(),
	}
}

// stream is one engine's event stream: sequence tracking, replay and the
// engine→router map. It belongs to one goroutine.
type stream struct {
	cfg       EngineConfig
	m         *mapper
	st        *EngineStats
	rep       *replayClient // nil without a replay endpoint
	log       *slog.Logger
	batch     Batch
	started   bool
	next      uint64 // next expected sequence number
	dupFloor  uint64 // after a replay, live seqs in [dupFloor, next) are duplicates
	dupActive bool
}

// seqOf parses an 8-byte big-endian sequence frame.
func seqOf(f []byte) (uint64, bool) {
	if len(f) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(f), true
}

const endSeq = ^uint64(0)

// onFrames handles one live message: [topic, seq, payload] or [seq, payload].
func (s *stream) onFrames(ctx context.Context, frames [][]byte) {
	var seqF, payload []byte
	switch len(frames) {
	case 3:
		seqF, payload = frames[1], frames[2]
	case 2:
		seqF, payload = frames[0], frames[1]
	default:
		s.malformed(fmt.Errorf("%d frames, want 3", len(frames)))
		return
	}
	seq, ok := seqOf(seqF)
	if !ok {
		s.malformed(fmt.Errorf("sequence frame of %d bytes, want 8", len(seqF)))
		return
	}
	s.onMessage(ctx, seq, payload)
}

func (s *stream) onMessage(ctx context.Context, seq uint64, payload []byte) {
	replayed := false
	switch {
	case !s.started:
		s.started = true
		s.next = seq
		if seq > 0 && s.rep != nil {
			// Joining a running engine: take what its replay buffer has.
			replayed = s.recover(ctx, 0)
		}
	case seq < s.next:
		if s.dupActive && seq >= s.dupFloor {
			s.st.duplicates.Add(1)
			return
		}
		s.st.restarts.Add(1)
		s.log.Warn("kv events: sequence went back, engine restarted; dropping its blocks",
			"endpoint", s.cfg.Name, "seq", seq, "expected", s.next)
		s.m.reset()
		s.next, s.dupActive = seq, false
		if seq > 0 && s.rep != nil {
			replayed = s.recover(ctx, 0)
		}
	case seq > s.next:
		s.st.gaps.Add(1)
		s.log.Info("kv events: sequence gap", "endpoint", s.cfg.Name, "expected", s.next, "got", seq, "replay", s.rep != nil)
		if s.rep != nil {
			replayed = s.recover(ctx, s.next)
		}
	}
	if seq < s.next {
		s.st.duplicates.Add(1) // already applied from the replay
		return
	}
	if seq > s.next && !replayed {
		s.st.unrecovered.Add(1)
		s.log.Warn("kv events: batches lost", "endpoint", s.cfg.Name, "from", s.next, "to", seq-1)
	}
	s.dupActive = false
	s.apply(seq, payload)
}

// apply decodes and applies one batch with sequence number seq.
func (s *stream) apply(seq uint64, payload []byte) {
	s.next = seq + 1
	s.st.lastSeq.Store(int64(seq))
	if err := Decode(payload, &s.batch); err != nil {
		s.malformed(fmt.Errorf("seq %d: %w", seq, err))
		return
	}
	s.st.batches.Add(1)
	s.m.apply(&s.batch)
	s.st.mapSize.Store(int64(s.m.nodes.len()))
}

func (s *stream) malformed(err error) {
	n := s.st.malformed.Add(1)
	if n <= 10 || n%1000 == 0 {
		s.log.Warn("kv events: malformed frame", "endpoint", s.cfg.Name, "count", n, "err", err)
	}
}

// recover asks the replay socket for every buffered batch from seq from on
// and applies the ones not seen yet. It reports whether the replay
// completed and covered s.next.
func (s *stream) recover(ctx context.Context, from uint64) bool {
	s.st.replays.Add(1)
	covered := true
	err := s.rep.request(ctx, from, func(seq uint64, payload []byte) {
		if seq < s.next {
			return
		}
		if seq > s.next {
			covered = false
			s.st.unrecovered.Add(1)
			s.log.Warn("kv events: replay buffer does not reach back far enough", "endpoint", s.cfg.Name, "from", s.next, "first", seq)
		}
		s.st.replayedBatches.Add(1)
		s.apply(seq, payload)
	})
	s.dupFloor, s.dupActive = from, true
	if err != nil {
		s.st.replayFailures.Add(1)
		s.log.Warn("kv events: replay failed", "endpoint", s.cfg.Name, "replay", s.cfg.Replay, "err", err)
		return false
	}
	return covered
}

// replayClient asks an engine's replay ROUTER for missed batches.
type replayClient struct {
	endpoint string
	timeout  time.Duration
	log      *slog.Logger
	sock     zmq4.Socket
	cancel   context.CancelFunc
	ch       chan recvResult
}

type recvResult struct {
	msg zmq4.Msg
	err error
}

var errReplayTimeout = errors.New("replay timed out")

func (c *replayClient) connect(ctx context.Context) error {
	cctx, cancel := context.WithCancel(ctx)
	sock := zmq4.NewDealer(cctx, zmq4.WithDialerRetry(100*time.Millisecond), zmq4.WithDialerMaxRetries(3))
	if err := sock.Dial(c.endpoint); err != nil {
		cancel()
		sock.Close()
		return fmt.Errorf("dial replay %s: %w", c.endpoint, err)
	}
	ch := make(chan recvResult, 64)
	go func() {
		for {
			msg, err := sock.Recv()
			select {
			case ch <- recvResult{msg, err}:
			case <-cctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	c.sock, c.cancel, c.ch = sock, cancel, ch
	return nil
}

func (c *replayClient) close() {
	if c.sock != nil {
		c.cancel()
		c.sock.Close()
		c.sock, c.cancel, c.ch = nil, nil, nil
	}
}

// request sends ["", start_seq] and calls fn for every replied batch until
// the end marker. Replies are ["", topic, seq, payload] (newer vLLM) or
// ["", seq, payload] (older).
func (c *replayClient) request(ctx context.Context, from uint64, fn func(seq uint64, payload []byte)) error {
	// A fresh DEALER per request: replays are rare, and a connection to a
	// ROUTER that has since restarted would otherwise linger.
	if err := c.connect(ctx); err != nil {
		return err
	}
	defer c.close()
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := c.sock.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		c.close()
		return fmt.Errorf("send replay request: %w", err)
	}
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			c.close()
			return ctx.Err()
		case <-timer.C:
			c.close()
			return errReplayTimeout
		case r := <-c.ch:
			if r.err != nil {
				c.close()
				return fmt.Errorf("replay recv: %w", r.err)
			}
			f := r.msg.Frames
			if len(f) > 0 && len(f[0]) == 0 && len(f) >= 3 {
				f = f[1:]
			}
			var seqF, payload []byte
			switch len(f) {
			case 3:
				seqF, payload = f[1], f[2]
			case 2:
				seqF, payload = f[0], f[1]
			default:
				c.log.Warn("kv events: malformed replay reply", "replay", c.endpoint, "frames", len(r.msg.Frames))
				continue
			}
			seq, ok := seqOf(seqF)
			if !ok {
				c.log.Warn("kv events: malformed replay sequence", "replay", c.endpoint, "bytes", len(seqF))
				continue
			}
			if seq == endSeq {
				return nil
			}
			fn(seq, payload)
			timer.Reset(c.timeout) // Go ≥ 1.23 timers: no stale tick after Reset
		}
	}
}
