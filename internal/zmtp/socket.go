package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// kind is a socket type.
type kind uint8

const (
	kindPub kind = iota
	kindSub
	kindRouter
	kindDealer
)

func (k kind) String() string {
	return [...]string{"PUB", "SUB", "ROUTER", "DEALER"}[k]
}

// accepts reports whether a peer of socket type peer may talk to k (ZMTP
// 3.1's compatibility table, for our types).
func (k kind) accepts(peer string) bool {
	switch k {
	case kindPub:
		return peer == "SUB" || peer == "XSUB"
	case kindSub:
		return peer == "PUB" || peer == "XPUB"
	case kindRouter:
		return peer == "DEALER" || peer == "REQ" || peer == "ROUTER"
	case kindDealer:
		return peer == "ROUTER" || peer == "REP" || peer == "DEALER"
	}
	return false
}

// Stats are a socket's counters.
type Stats struct {
	Peers             int         `json:"peers"`              // established connections now
	Connects          uint64      `json:"connects"`           // handshakes completed
	Refused           uint64      `json:"refused"`            // connections closed on accept: MaxPeers reached
	HandshakeFailures uint64      `json:"handshake_failures"` // bad or late greeting/READY, wrong socket type or mechanism
	Oversize          uint64      `json:"oversize"`           // peers disconnected for a message over MaxMsgSize or MaxFrames
	ProtocolErrors    uint64      `json:"protocol_errors"`    // peers disconnected for other malformed traffic
	ReadTimeouts      uint64      `json:"read_timeouts"`      // peers disconnected for a message not completed within ReadTimeout
	WriteTimeouts     uint64      `json:"write_timeouts"`     // peers disconnected for a write stalled past WriteTimeout
	RecvBufferFull    uint64      `json:"recv_buffer_full"`   // peers disconnected for lack of receive buffer
	Dropped           uint64      `json:"dropped"`            // messages dropped for a full peer queue (Pub), all peers
	Sent              uint64      `json:"sent"`               // messages written
	Received          uint64      `json:"received"`           // messages queued for Recv
	PeerStats         []PeerStats `json:"peer_stats,omitempty"`
}

// PeerStats are one established connection's counters.
type PeerStats struct {
	Remote        string `json:"remote"`
	Sent          uint64 `json:"sent"`
	Dropped       uint64 `json:"dropped"`
	Queued        int    `json:"queued"`
	Subscriptions int    `json:"subscriptions,omitempty"` // Pub: the peer's distinct subscriptions
}

type counters struct {
	connects, refused, handshake, oversize, protocol atomic.Uint64
	readTimeouts, writeTimeouts, recvBuffer          atomic.Uint64
	dropped, sent, received                          atomic.Uint64
}

type inMsg struct {
	frames [][]byte
	held   int64    // receive budget taken
	from   net.Addr // the sending peer's remote address
}

type outMsg struct {
	frames [][]byte
	cmd    bool // frames[0] is a command body
}

// socket is what the four socket types share.
type socket struct {
	kind   kind
	o      Options
	log    *slog.Logger
	ctx    context.Context // done on Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	in     chan inMsg
	budget *budget
	shared chan outMsg // Dealer: outgoing messages for whichever peer is up

	mu     sync.Mutex
	closed bool
	lns    []net.Listener
	conns  map[*conn]struct{}
	nBound int
	byID   map[string]*conn    // Router
	nextID uint32              // Router
	subs   map[string]struct{} // Sub: our subscriptions

	ready   atomic.Pointer[[]*conn] // established connections
	subList atomic.Pointer[subSet]  // Sub: our subscriptions, for filtering

	st    counters
	warnN atomic.Uint64
}

func newSocket(k kind, o Options) (*socket, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &socket{
		kind: k, o: o, log: o.Logger.With("zmq", k.String()), ctx: ctx, cancel: cancel,
		conns: map[*conn]struct{}{},
	}
	switch k {
	case kindSub, kindRouter, kindDealer:
		s.in = make(chan inMsg, o.RecvQueue)
		s.budget = newBudget(o.RecvBuffer)
	case kindPub:
		// Peers only send subscriptions; they still take budget while read.
		s.budget = newBudget(o.RecvBuffer)
	}
	switch k {
	case kindRouter:
		s.byID = map[string]*conn{}
	case kindSub:
		s.subs = map[string]struct{}{}
		s.subList.Store(&subSet{})
	case kindDealer:
		s.shared = make(chan outMsg, o.SendQueue)
	}
	s.ready.Store(&[]*conn{})
	return s, nil
}

// bind listens on endpoint and accepts peers until Close.
func (s *socket) bind(endpoint string) (net.Addr, error) {
	addr, err := parseEndpoint(endpoint, true)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", endpoint, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil, ErrClosed
	}
	s.lns = append(s.lns, ln)
	s.wg.Add(1)
	s.mu.Unlock()
	go s.acceptLoop(ln)
	return ln.Addr(), nil
}

func (s *socket) addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lns) == 0 {
		return nil
	}
	return s.lns[0].Addr()
}

func (s *socket) acceptLoop(ln net.Listener) {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, do not spin.
			s.warn("accept", "err", err)
			if !s.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		c, ok := s.admit(nc, true)
		if !ok {
			continue
		}
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
		}()
	}
}

// admit registers a new connection. A bound one counts against MaxPeers
// and is given a WaitGroup slot for its goroutine.
func (s *socket) admit(nc net.Conn, bound bool) (*conn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		nc.Close()
		return nil, false
	}
	if bound {
		if s.nBound >= s.o.MaxPeers {
			n := s.st.refused.Add(1)
			nc.Close()
			if n <= 10 || n%1000 == 0 {
				s.log.Warn("zmq: connection refused, peer limit reached", "remote", nc.RemoteAddr().String(), "max_peers", s.o.MaxPeers, "refused", n)
			}
			return nil, false
		}
		s.nBound++
		s.wg.Add(1)
	}
	c := newConn(s, nc, bound)
	s.conns[c] = struct{}{}
	return c, true
}

func (s *socket) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if c.bound {
		s.nBound--
	}
	s.mu.Unlock()
}

// dial connects to endpoint in the background, reconnecting with backoff
// until Close.
func (s *socket) dial(endpoint string) error {
	addr, err := parseEndpoint(endpoint, false)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.wg.Add(1)
	go s.dialLoop(addr)
	return nil
}

func (s *socket) dialLoop(addr string) {
	defer s.wg.Done()
	backoff := s.o.ReconnectInterval
	d := net.Dialer{Timeout: s.o.HandshakeTimeout}
	failing := false // log the first failure of a series as a warning, the rest at debug level
	for {
		nc, err := d.DialContext(s.ctx, "tcp", addr)
		if err == nil {
			if c, ok := s.admit(nc, false); ok && s.serveConn(c) {
				backoff, failing = s.o.ReconnectInterval, false
			}
		} else if s.ctx.Err() == nil {
			if !failing {
				s.log.Warn("zmq: cannot connect, retrying", "addr", addr, "err", err)
			} else {
				s.log.Debug("zmq: dial", "addr", addr, "err", err)
			}
			failing = true
		}
		if !s.sleep(backoff) {
			return
		}
		backoff = min(2*backoff, s.o.ReconnectMax)
	}
}

// sleep waits d; false when the socket closed meanwhile.
func (s *socket) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// serveConn runs one connection to its end and reports whether its
// handshake completed.
func (s *socket) serveConn(c *conn) bool {
	defer s.forget(c)
	if err := c.handshake(); err != nil {
		c.close(err)
		if s.ctx.Err() == nil {
			s.st.handshake.Add(1)
			s.warn("zmq: handshake failed", "remote", c.remote.String(), "err", err)
		}
		return false
	}
	if err := s.attach(c); err != nil {
		c.close(err)
		return false
	}
	s.st.connects.Add(1)
	s.log.Debug("zmq: peer connected", "remote", c.remote.String(), "minor", c.minor)
	s.wg.Add(1)
	go c.writeLoop()
	if s.o.OnConnect != nil {
		s.o.OnConnect(c.remote)
	}
	c.close(c.readLoop())
	s.detach(c)
	err := c.cause()
	if s.ctx.Err() != nil {
		err = nil
	} else {
		s.count(c, err)
	}
	if s.o.OnDisconnect != nil {
		s.o.OnDisconnect(c.remote, err)
	}
	return true
}

// count classifies why an established connection ended.
func (s *socket) count(c *conn, err error) {
	var n *atomic.Uint64
	switch {
	case errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTooManyFrames):
		n = &s.st.oversize
	case errors.Is(err, ErrProtocol):
		n = &s.st.protocol
	case errors.Is(err, ErrReadTimeout):
		n = &s.st.readTimeouts
	case errors.Is(err, ErrWriteTimeout):
		n = &s.st.writeTimeouts
	case errors.Is(err, ErrRecvBuffer):
		n = &s.st.recvBuffer
	default:
		s.log.Debug("zmq: peer disconnected", "remote", c.remote.String(), "err", err)
		return
	}
	n.Add(1)
	s.warn("zmq: peer disconnected", "remote", c.remote.String(), "err", err)
}

// warn logs at warning level, rate-limited per socket (the first 10, then
// every 1000th), else at debug level.
func (s *socket) warn(msg string, args ...any) {
	n := s.warnN.Add(1)
	if n <= 10 || n%1000 == 0 {
		s.log.Warn(msg, append(args, "warnings", n)...)
		return
	}
	s.log.Debug(msg, args...)
}

// attach makes an established connection visible: routing id, initial
// subscriptions, fan-out list.
func (s *socket) attach(c *conn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	switch s.kind {
	case kindRouter:
		c.id = c.peerID
		if len(c.id) == 0 || c.id[0] == 0 || s.byID[string(c.id)] != nil {
			// libzmq's form: a zero byte and a counter.
			for {
				s.nextID++
				c.id = binary.BigEndian.AppendUint32([]byte{0}, s.nextID)
				if s.byID[string(c.id)] == nil {
					break
				}
			}
		}
		s.byID[string(c.id)] = c
	case kindSub:
		for t := range s.subs {
			if !c.enqueue(c.subscription(true, []byte(t))) {
				return fmt.Errorf("zmtp: %d subscriptions do not fit the send queue", len(s.subs))
			}
		}
	}
	old := *s.ready.Load()
	next := append(append(make([]*conn, 0, len(old)+1), old...), c)
	s.ready.Store(&next)
	return nil
}

func (s *socket) detach(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kind == kindRouter && s.byID[string(c.id)] == c {
		delete(s.byID, string(c.id))
	}
	old := *s.ready.Load()
	next := make([]*conn, 0, len(old))
	for _, x := range old {
		if x != c {
			next = append(next, x)
		}
	}
	s.ready.Store(&next)
}

// deliver queues a received message for Recv.
func (s *socket) deliver(c *conn, frames [][]byte, held int64) error {
	select {
	case s.in <- inMsg{frames: frames, held: held, from: c.remote}:
		s.st.received.Add(1)
		return nil
	case <-c.done:
		s.budget.release(held)
		return ErrClosed
	}
}

func (s *socket) recv(ctx context.Context) ([][]byte, net.Addr, error) {
	select {
	case m := <-s.in:
		s.budget.release(m.held)
		return m.frames, m.from, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-s.ctx.Done():
		return nil, nil, ErrClosed
	}
}

// connected reports whether an established connection's remote address
// is remote.
func (s *socket) connected(remote net.Addr) bool {
	if remote == nil {
		return false
	}
	want := remote.String()
	for _, c := range *s.ready.Load() {
		if c.remote.String() == want {
			return true
		}
	}
	return false
}

func (s *socket) stats() Stats {
	st := Stats{
		Connects: s.st.connects.Load(), Refused: s.st.refused.Load(), HandshakeFailures: s.st.handshake.Load(),
		Oversize: s.st.oversize.Load(), ProtocolErrors: s.st.protocol.Load(), ReadTimeouts: s.st.readTimeouts.Load(),
		WriteTimeouts: s.st.writeTimeouts.Load(), RecvBufferFull: s.st.recvBuffer.Load(),
		Dropped: s.st.dropped.Load(), Sent: s.st.sent.Load(), Received: s.st.received.Load(),
	}
	for _, c := range *s.ready.Load() {
		ps := PeerStats{Remote: c.remote.String(), Sent: c.sent.Load(), Dropped: c.dropped.Load(), Queued: len(c.out)}
		if ss := c.subs.Load(); ss != nil {
			ps.Subscriptions = len(ss.prefixes)
		}
		st.PeerStats = append(st.PeerStats, ps)
	}
	st.Peers = len(st.PeerStats)
	sort.Slice(st.PeerStats, func(i, j int) bool { return st.PeerStats[i].Remote < st.PeerStats[j].Remote })
	return st
}

// close stops every goroutine of the socket and waits for them.
func (s *socket) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	lns := s.lns
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	var err error
	for _, ln := range lns {
		if e := ln.Close(); e != nil && !errors.Is(e, net.ErrClosed) {
			err = errors.Join(err, e)
		}
	}
	for _, c := range conns {
		c.close(ErrClosed)
	}
	s.wg.Wait()
	return err
}

// subSet is an immutable set of subscription prefixes.
type subSet struct {
	all      bool // the empty prefix: everything
	prefixes [][]byte
}

func newSubSet(m map[string]struct{}) *subSet {
	ss := &subSet{prefixes: make([][]byte, 0, len(m))}
	for p := range m {
		ss.all = ss.all || p == ""
		ss.prefixes = append(ss.prefixes, []byte(p))
	}
	return ss
}

func (ss *subSet) match(topic []byte) bool {
	if ss.all {
		return true
	}
	for _, p := range ss.prefixes {
		if bytes.HasPrefix(topic, p) {
			return true
		}
	}
	return false
}
