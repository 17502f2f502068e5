package kvevents

import (
	"context"

	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/internal/zmtp"
)

// EngineStats are one engine stream's counters; read them with Snapshot.
type EngineStats struct {
	batches, events, storedBlocks, removedBlocks, clears    atomic.Int64
	unknownEvents, badEvents, orphans, unknownRemoves       atomic.Int64
	mapEvicted, gaps, replays, replayedBatches, unrecovered atomic.Int64
	replayFailures, restarts, malformed                     atomic.Int64
	connects, mapSize                                       atomic.Int64
	lastSeq                                                 atomic.Uint64
	started                                                 atomic.Bool
}

// EngineSnapshot is a copy of one engine's counters, as served by the admin
// API.
type EngineSnapshot struct {
	Endpoint        string  `json:"endpoint"`
	Model           string  `json:"model"`
	Events          string  `json:"events,omitempty"`
	Replay          string  `json:"replay,omitempty"`
	LastSeq         *uint64 `json:"last_seq"` // null before the first batch
	Connects        int64   `json:"connects"` // handshakes with its PUB (per-engine mode)
	Batches         int64   `json:"batches"`
	EventsSeen      int64   `json:"events_seen"`
	StoredBlocks    int64   `json:"stored_blocks"`
	RemovedBlocks   int64   `json:"removed_blocks"`
	Clears          int64   `json:"clears"`
	Gaps            int64   `json:"gaps"`
	Replays         int64   `json:"replays"`
	ReplayedBatches int64   `json:"replayed_batches"`
	ReplayFailures  int64   `json:"replay_failures"`
	Unrecovered     int64   `json:"unrecovered_gaps"`
	Restarts        int64   `json:"restarts"`
	Malformed       int64   `json:"malformed_frames"`
	BadEvents       int64   `json:"bad_events"`
	UnknownEvents   int64   `json:"unknown_events"`
	OrphanBlocks    int64   `json:"orphan_blocks"`
	UnknownRemoves  int64   `json:"unknown_removes"`
	MapBlocks       int64   `json:"map_blocks"`
	MapEvicted      int64   `json:"map_evicted"`
	// ZMQ is the per-engine SUB socket's counters (per-engine mode).
	ZMQ *zmtp.Stats `json:"zmq,omitempty"`
}

func (s *EngineStats) snapshot() EngineSnapshot {
	sn := EngineSnapshot{
		Connects: s.connects.Load(), Batches: s.batches.Load(), EventsSeen: s.events.Load(),
		StoredBlocks: s.storedBlocks.Load(), RemovedBlocks: s.removedBlocks.Load(), Clears: s.clears.Load(),
		Gaps: s.gaps.Load(), Replays: s.replays.Load(), ReplayedBatches: s.replayedBatches.Load(),
		ReplayFailures: s.replayFailures.Load(), Unrecovered: s.unrecovered.Load(),
		Restarts: s.restarts.Load(), Malformed: s.malformed.Load(), BadEvents: s.badEvents.Load(),
		UnknownEvents: s.unknownEvents.Load(), OrphanBlocks: s.orphans.Load(), UnknownRemoves: s.unknownRemoves.Load(),
		MapBlocks: s.mapSize.Load(), MapEvicted: s.mapEvicted.Load(),
	}
	if s.started.Load() {
		last := s.lastSeq.Load()
		sn.LastSeq = &last
	}
	return sn
}

// stream is one engine's event stream: sequence tracking, replay and the
// engine→router map. It belongs to one goroutine.
type stream struct {
	cfg      EngineConfig
	m        *mapper
	st       *EngineStats
	rep      replayer // nil without a replay endpoint
	log      *slog.Logger
	sock     atomic.Pointer[zmtp.Sub] // per-engine mode: its SUB, for Stats
	stopMu   sync.Mutex
	stopFn   func() // per-engine mode: stops its receive loop
	fromWire bool   // registered from a central-mode topic
	batch    Batch
	started  bool
	next     uint64 // next expected sequence number, unless past
	past     bool   // 2^64-1 was applied: every sequence number is behind
	// sizeChecked: warnSmallBlocks has seen the engine's block size.
	sizeChecked bool
	// connected carries a connection to the engine's PUB (per-engine
	// mode, with a replay endpoint) to the receive loop (onConnect).
	connected chan struct{}
	// lastHash is the hash of the last applied batch's payload, which a
	// reconnection's replay compares (resync).
	lastHash uint64
	// dupWindow: a replay at a connection has applied batches that live
	// frames queued meanwhile bring again; until a live frame past them
	// comes, one behind is such a duplicate, not a restart.
	dupWindow bool
	// centralRank is 1 + the data-parallel rank whose central SUB feeds
	// the stream (0: none yet): one goroutine a stream.
	centralRank atomic.Int32
	// feeder is the connection whose frames feed the stream in central
	// mode (its rank's goroutine only): another is refused while it is
	// connected (Subscriber.fedBy).
	feeder      net.Addr
	refusedFrom string // the connection last refused (logged once)
	// newFeeder: another connection took over from the feeder (an
	// engine that dialed again: restarted, or its connection broke);
	// its first frame resyncs (onFrames). Its rank's goroutine only.
	newFeeder bool
	// lastFrame is when the last frame came (unix ns; central mode's
	// engines registered from topics: evictSilentWire).
	lastFrame atomic.Int64
	// adopted: registered from a topic, then configured (SetEngines).
	adopted atomic.Bool
	// mu serialises the stream's state between the goroutine that
	// receives its frames and a resync asked from outside
	// (Subscriber.Resync).
	mu sync.Mutex
}

// claim binds the stream to the central SUB of rank (the first to ask
// wins) and reports whether it is that SUB's.
func (s *stream) claim(rank int) bool {
	r := int32(rank) + 1
	return s.centralRank.CompareAndSwap(0, r) || s.centralRank.Load() == r
}

// stop ends the stream's receive loop and waits for it (no-op if none).
func (st *stream) stop() {
	st.stopMu.Lock()
	f := st.stopFn
	st.stopFn = nil
	st.stopMu.Unlock()
	if f != nil {
		f()
	}
}

// replayer asks an engine's replay socket for the batches from seq from on
// and calls fn for each reply until the end marker, the time budget or fn
// returning false.
type replayer interface {
	request(ctx context.Context, from uint64, fn func(seq uint64, payload []byte) bool) error
}

// seqOf parses an 8-byte big-endian sequence frame.
func seqOf(f []byte) (uint64, bool) {
	if len(f) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(f), true
}

const endSeq = ^uint64(0)

// splitBatch parses [topic, seq, payload] or [seq, payload].
func splitBatch(frames [][]byte) (seq uint64, payload []byte, err error) {
	var seqF []byte
	switch len(frames) {
	case 3:
		seqF, payload = frames[1], frames[2]
	case 2:
		seqF, payload = frames[0], frames[1]
	default:
		return 0, nil, fmt.Errorf("%d frames, want 3", len(frames))
	}
	seq, ok := seqOf(seqF)
	if !ok {
		return 0, nil, fmt.Errorf("sequence frame of %d bytes, want 8", len(seqF))
	}
	return seq, payload, nil
}

// onFrames handles one live message: [topic, seq, payload] or [seq, payload].
func (s *stream) onFrames(ctx context.Context, frames [][]byte) {
	if s.fromWire {
		s.lastFrame.Store(time.Now().UnixNano())
	}
	seq, payload, err := splitBatch(frames)
	if err != nil {
		s.malformed(err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.newFeeder {
		// Central mode: a new connection feeds the endpoint. As at a
		// per-engine reconnection (onConnect), the replay says whether
		// it is the same engine; a restarted one whose new sequence
		// reached exactly the old next number was otherwise taken for
		// the old one.
		s.newFeeder = false
		if s.rep != nil && s.started && !s.past {
			s.resync(ctx)
		}
	}
	s.onMessage(ctx, seq, payload)
}

// behind reports whether seq is before the next expected one.
func (s *stream) behind(seq uint64) bool { return s.past || seq < s.next }

// onMessage handles live batch seq. Missing batches before it are asked
// from the replay socket first, up to seq and no further, so the live
// batch is never mistaken for a duplicate.
func (s *stream) onMessage(ctx context.Context, seq uint64, payload []byte) {
	if s.dupWindow {
		if s.started && !s.past && seq < s.next {
			return // applied by the connection's replay
		}
		s.dupWindow = false
	}
	switch {
	case !s.started:
		s.started, s.next = true, seq
		if seq > 0 && s.rep != nil {
			// Joining a running engine: apply what its buffer has before seq.
			s.recover(ctx, 0, seq, true)
		}
	case s.behind(seq):
		s.log.Warn("kv events: sequence went back, engine restarted; dropping its blocks",
			"endpoint", s.cfg.Name, "seq", seq, "expected", s.expected())
		s.m.reset()
		s.st.restarts.Add(1) // counted once its blocks are gone: a reader of the count sees them gone
		s.next, s.past = seq, false
		if seq > 0 && s.rep != nil {
			s.recover(ctx, 0, seq, true)
		}
	case seq > s.next:
		s.st.gaps.Add(1)
		s.log.Info("kv events: sequence gap", "endpoint", s.cfg.Name, "expected", s.next, "got", seq, "replay", s.rep != nil)
		if s.rep != nil {
			s.recoverGap(ctx, seq)
		}
	}
	if seq > s.next {
		s.st.unrecovered.Add(1)
		s.log.Warn("kv events: batches lost", "endpoint", s.cfg.Name, "from", s.next, "to", seq-1)
	}
	s.apply(seq, payload)
}

// expected is the next expected sequence number for logs.
func (s *stream) expected() string {
	if s.past {
		return "2^64"
	}
	return fmt.Sprint(s.next)
}

// apply decodes and applies one batch with sequence number seq; the
// stream's last_seq says seq once the batch is applied (or refused as
// malformed), so an index read after seeing it reflects the batch.
func (s *stream) apply(seq uint64, payload []byte) {
	s.next, s.past = seq+1, seq == endSeq
	defer func() {
		s.st.lastSeq.Store(seq)
		s.st.started.Store(true)
	}()
	if err := Decode(payload, &s.batch); err != nil {
		s.malformed(fmt.Errorf("seq %d: %w", seq, err))
		return
	}
	s.st.batches.Add(1)
	if s.rep != nil { // only a replay at a reconnection compares it (resync)
		s.lastHash = xxhash.Sum64(payload)
	}
	s.m.apply(&s.batch)
	s.st.mapSize.Store(int64(s.m.nodes.len()))
	if !s.sizeChecked {
		s.warnSmallBlocks()
	}
}

// warnSmallBlocks logs, at the first BlockStored, an engine whose blocks are a quarter of the
// router's or smaller: every engine block is a node of the engine→router
// map, so at SGLang's default page size of 1 the map costs about 255 bytes
// a cached token against 9 at 16 (docs/kvindex.md, "SGLang's events"),
// and its bound (MaxMapBlocks) covers that many tokens only.
func (s *stream) warnSmallBlocks() {
	for i := range s.batch.Events {
		e := &s.batch.Events[i]
		if e.Kind != KindBlockStored || e.BlockSize <= 0 {
			continue
		}
		s.sizeChecked = true
		if rbs := s.m.routerBS; e.BlockSize*4 <= rbs {
			s.log.Warn("kv events: the engine's blocks are much smaller than kvgate's; its engine→router map costs far more memory a cached token (about 255 bytes at 1-token blocks, SGLang's default page size, against 9 at 16) and holds at most max-map-blocks blocks: give the engine a block or page size of "+strconv.Itoa(rbs)+" (SGLang --page-size)",
				"endpoint", s.cfg.Name, "engine_block_size", e.BlockSize, "block_size", rbs)
		}
		return
	}
}

func (s *stream) malformed(err error) {
	n := s.st.malformed.Add(1)
	if n <= 10 || n%1000 == 0 {
		s.log.Warn("kv events: malformed frame", "endpoint", s.cfg.Name, "count", n, "err", err)
	}
}

// onConnect runs in the receive loop when the engine's PUB accepted a
// connection (its first, or a reconnection): with a replay endpoint, the
// engine's buffer is asked at once rather than at its next batch, which a
// quiet engine may not send for long. Never started: the buffer warms the
// index (a gateway started beside a running engine). Started: resync.
func (s *stream) onConnect(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rep == nil || s.past {
		return
	}
	if !s.started {
		s.warm(ctx)
		return
	}
	s.resync(ctx)
}

// warm applies what the engine's replay buffer holds, from its oldest
// batch, as the sequence's start.
func (s *stream) warm(ctx context.Context) {
	s.st.replays.Add(1)
	err := s.rep.request(ctx, 0, func(seq uint64, payload []byte) bool {
		if s.started && seq < s.next {
			return true // a duplicate reply
		}
		s.replayed(seq, payload, !s.started) // the buffer's oldest starts the sequence
		s.started = true
		return !s.past
	})
	if err != nil {
		s.st.replayFailures.Add(1)
		s.log.Warn("kv events: replay at connection failed", "endpoint", s.cfg.Name, "replay", s.cfg.Replay, "err", err)
	}
	s.dupWindow = s.started
}

// resync asks the reconnected engine for the last batch applied and what
// followed: the same batch (its payload's hash) means the same engine,
// and what it sent meanwhile is applied; another batch, or none (a
// restarted engine numbers from 0 again, or its buffer no longer reaches
// back), means its cache is not what the index holds: its blocks are
// dropped and its buffer warms the index again, as at a restart seen in
// the live sequence. A replay that fails changes nothing (the next live
// batch decides, as before).
func (s *stream) resync(ctx context.Context) {
	same, err := s.replayAfterLast(ctx, 0)
	switch {
	case err != nil:
		s.st.replayFailures.Add(1)
		s.log.Warn("kv events: replay at reconnection failed; the next batch decides", "endpoint", s.cfg.Name, "replay", s.cfg.Replay, "err", err)
		return
	case !same:
		s.log.Warn("kv events: reconnected to an engine whose replay does not continue what was applied (restarted); dropping its blocks",
			"endpoint", s.cfg.Name, "last_seq", s.next-1)
		s.m.reset()
		s.st.started.Store(false) // last_seq: null until the new engine's first batch
		s.st.restarts.Add(1)      // once its blocks are gone, as above
		s.started, s.next, s.past = false, 0, false
		s.warm(ctx)
		return
	}
	s.dupWindow = true
}

// replayAfterLast asks the replay from the last batch applied: when its
// first reply is that batch as applied (its payload's hash), the engine
// is the same, and the batches after it are applied, those before until
// only (0: all). It reports whether the engine is the same, and the
// replay's error.
func (s *stream) replayAfterLast(ctx context.Context, until uint64) (same bool, err error) {
	s.st.replays.Add(1)
	last, hash := s.next-1, s.lastHash
	bounded := until != 0
	budget := until - last + maxExtraReplies
	if !bounded || budget < maxExtraReplies { // overflow
		budget = endSeq
	}
	decided := false
	err = s.rep.request(ctx, last, func(seq uint64, payload []byte) bool {
		budget--
		if !decided {
			decided, same = true, seq == last && xxhash.Sum64(payload) == hash
			return same && budget > 0
		}
		if bounded && seq >= until || budget == 0 {
			return false
		}
		if seq < s.next {
			return true // already applied
		}
		s.replayed(seq, payload, false)
		return !s.past && (!bounded || s.next < until)
	})
	return same, err
}

// replayed applies a batch a replay brought and counts it; one past the
// next expected means the buffer no longer held the batches between
// (lost, counted and logged), unless it starts the sequence (starts).
func (s *stream) replayed(seq uint64, payload []byte, starts bool) {
	if seq > s.next && !starts {
		s.st.unrecovered.Add(1)
		s.log.Warn("kv events: replay buffer does not reach back far enough", "endpoint", s.cfg.Name, "from", s.next, "first", seq)
	}
	s.st.replayedBatches.Add(1)
	s.apply(seq, payload)
}

// recoverGap recovers the batches before live batch until, which is past
// the next expected one, asking the replay from the last batch applied:
// the same batch again (its payload's hash) means the same engine, and
// the missed ones are applied; another, or none, means the engine
// restarted and its new sequence passed the old one before the index
// heard it (its first batches went while no connection fed the stream):
// its blocks are dropped and its buffer warms the index, as at a restart
// seen going back. Until 2026-12-05 the replay's batches were applied
// onto the old engine's blocks, which the index kept claiming for good
// (a walkthrough's central-mode restart: 283 blocks indexed for an engine
// of 256, 16 000 orphans). Without a last batch (none applied) the missed
// ones are asked for as they are.
func (s *stream) recoverGap(ctx context.Context, until uint64) {
	if s.next == 0 {
		s.recover(ctx, 0, until, false)
		return
	}
	same, err := s.replayAfterLast(ctx, until)
	switch {
	case err != nil:
		s.st.replayFailures.Add(1)
		s.log.Warn("kv events: replay failed", "endpoint", s.cfg.Name, "replay", s.cfg.Replay, "err", err)
	case !same:
		s.log.Warn("kv events: sequence jumped ahead and the engine's replay does not continue what was applied (restarted); dropping its blocks",
			"endpoint", s.cfg.Name, "last_seq", s.next-1, "seq", until)
		s.m.reset()
		s.st.restarts.Add(1) // once its blocks are gone, as above
		s.next, s.past = 0, false
		s.recover(ctx, 0, until, true)
	}
}

// maxExtraReplies bounds the replies a replay may send beyond the batches
// it was asked for (duplicates of what is applied already).
const maxExtraReplies = 64

// recover asks the replay socket for the batches in [from, until) and
// applies the ones not applied yet, in order. With warm (joining, or after
// a restart) the oldest batch the buffer still has starts the sequence;
// otherwise batches the buffer no longer has are lost. It stops at the
// first batch numbered until or later (live frames bring those), once
// [from, until) is applied, after until-from replies plus a few more, or
// when the replay client's time budget runs out. On return s.next is
// until when everything was recovered.
func (s *stream) recover(ctx context.Context, from, until uint64, warm bool) {
	s.st.replays.Add(1)
	s.next = from
	budget := until - from + maxExtraReplies
	if budget < maxExtraReplies { // overflow
		budget = endSeq
	}
	first := true
	err := s.rep.request(ctx, from, func(seq uint64, payload []byte) bool {
		budget--
		if seq >= until || budget == 0 {
			return false
		}
		if seq < s.next {
			return true // already applied
		}
		s.replayed(seq, payload, warm && first)
		first = false
		return s.next < until
	})
	if err != nil {
		s.st.replayFailures.Add(1)
		s.log.Warn("kv events: replay failed", "endpoint", s.cfg.Name, "replay", s.cfg.Replay, "err", err)
	}
	if warm && first {
		s.next = until // nothing before the live batch to apply
	}
}

// replayClient asks an engine's replay ROUTER for missed batches, with a
// fresh DEALER per request (replays are rare, and a connection to a ROUTER
// that has since restarted would otherwise linger).
type replayClient struct {
	endpoint string
	timeout  time.Duration // for each reply
	budget   time.Duration // for the whole replay
	maxMsg   int64
	log      *slog.Logger
}

var (
	errReplayTimeout = errors.New("replay timed out")
	errReplayBudget  = errors.New("replay took longer than its budget")
)

// request sends ["", start_seq] and calls fn for every replied batch until
// the end marker, fn returning false, or the budget. Replies are ["",
// topic, seq, payload] (newer vLLM) or ["", seq, payload] (older).
func (c *replayClient) request(ctx context.Context, from uint64, fn func(seq uint64, payload []byte) bool) error {
	d, err := zmtp.NewDealer(zmtp.Options{MaxMsgSize: c.maxMsg, HandshakeTimeout: c.timeout, Logger: c.log})
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Dial(c.endpoint); err != nil {
		return fmt.Errorf("dial replay %s: %w", c.endpoint, err)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.budget, errReplayBudget)
	defer cancel()
	if err := d.Send(ctx, []byte{}, binary.BigEndian.AppendUint64(nil, from)); err != nil {
		return fmt.Errorf("send replay request: %w", err)
	}
	for {
		rctx, rcancel := context.WithTimeoutCause(ctx, c.timeout, errReplayTimeout)
		msg, err := d.Recv(rctx)
		rcancel()
		if err != nil {
			if cause := context.Cause(rctx); cause != nil {
				return cause
			}
			return fmt.Errorf("replay recv: %w", err)
		}
		f := msg
		if len(f) >= 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		seq, payload, err := splitBatch(f)
		if err != nil {
			c.log.Warn("kv events: malformed replay reply", "replay", c.endpoint, "err", err)
			continue
		}
		if seq == endSeq || !fn(seq, payload) {
			return nil
		}
	}
}
