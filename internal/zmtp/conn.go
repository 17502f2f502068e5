package zmtp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// More errors reported through OnDisconnect.
var (
	ErrReadTimeout  = errors.New("zmtp: message not completed in time")
	ErrWriteTimeout = errors.New("zmtp: peer stopped reading")
)

// bufferSizes are a connection's read and write buffer sizes: large on the
// side that carries the messages, small on the side that carries only
// subscriptions and requests.
func (k kind) bufferSizes() (read, write int) {
	const big, small = 64 << 10, 4 << 10
	switch k {
	case kindPub:
		return small, big
	case kindRouter:
		return small, big
	default: // Sub, Dealer
		return big, small
	}
}

// conn is one peer connection: a reader (the goroutine that runs
// serveConn) and a writer goroutine draining out.
type conn struct {
	s      *socket
	nc     net.Conn
	remote net.Addr
	bound  bool
	cr     connReader
	br     *bufio.Reader
	bw     *bufio.Writer
	rd     msgReader
	minor  byte   // 0: ZMTP 3.0 rules, 1: 3.1
	peerID []byte // the Identity the peer announced
	id     []byte // Router: its routing id
	out    chan outMsg
	done   chan struct{}

	closeOnce sync.Once
	errMu     sync.Mutex
	err       error

	subMap        map[string]struct{}    // Pub: the peer's subscriptions (reader goroutine only)
	subs          atomic.Pointer[subSet] // Pub: the same, for Send
	sent, dropped atomic.Uint64
}

func newConn(s *socket, nc net.Conn, bound bool) *conn {
	c := &conn{
		s: s, nc: nc, remote: nc.RemoteAddr(), bound: bound,
		out:  make(chan outMsg, s.o.SendQueue),
		done: make(chan struct{}),
	}
	c.cr.nc = nc
	rs, ws := s.kind.bufferSizes()
	c.br = bufio.NewReaderSize(&c.cr, rs)
	c.bw = bufio.NewWriterSize(nc, ws)
	c.rd = msgReader{
		br: c.br, cr: &c.cr, maxMsg: uint64(s.o.MaxMsgSize), maxFrames: s.o.MaxFrames,
		budget: s.budget, done: c.done, wait: s.o.ReadTimeout,
	}
	if s.in != nil {
		c.rd.backlog = func() bool { return len(s.in) > 0 }
	}
	if s.kind == kindPub {
		c.subMap = map[string]struct{}{}
		c.subs.Store(&subSet{})
	}
	return c
}

// close ends the connection; the first error given is its cause.
func (c *conn) close(err error) {
	c.errMu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.errMu.Unlock()
	c.closeOnce.Do(func() {
		close(c.done)
		c.nc.Close()
	})
}

func (c *conn) cause() error {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.err
}

// handshake exchanges greetings and READY commands (NULL mechanism).
func (c *conn) handshake() error {
	o := c.s.o
	_ = c.nc.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	props := property("Socket-Type", []byte(c.s.kind.String()))
	if c.s.kind == kindRouter || c.s.kind == kindDealer {
		props = append(props, property("Identity", o.Identity)...)
	}
	_, _ = c.bw.Write(greeting())
	_ = writeFrames(c.bw, [][]byte{command("READY", props)}, true)
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	minor, err := readGreeting(c.br)
	if err != nil {
		return err
	}
	frames, cmd, held, err := c.rd.readMsg(nil)
	c.s.budget.release(held)
	if err != nil {
		return fmt.Errorf("%w: READY: %w", ErrHandshake, err)
	}
	if !cmd {
		return fmt.Errorf("%w: message before READY", ErrHandshake)
	}
	name, data, err := parseCommand(frames[0])
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	switch name {
	case "READY":
	case "ERROR":
		return fmt.Errorf("%w: peer refused: %q", ErrHandshake, errorReason(data))
	default:
		return fmt.Errorf("%w: %q before READY", ErrHandshake, name)
	}
	var peerType string
	err = parseProperties(data, func(name string, value []byte) {
		switch {
		case strings.EqualFold(name, "Socket-Type"):
			peerType = string(value)
		case strings.EqualFold(name, "Identity"):
			c.peerID = append([]byte(nil), value...)
		}
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	if !c.s.kind.accepts(peerType) {
		reason := fmt.Sprintf("socket type %s cannot talk to %s", peerType, c.s.kind)
		_ = writeFrames(c.bw, [][]byte{command("ERROR", []byte{byte(len(reason))}, []byte(reason))}, true)
		_ = c.bw.Flush()
		return fmt.Errorf("%w: %s", ErrHandshake, reason)
	}
	c.minor = minor
	_ = c.nc.SetDeadline(time.Time{})
	c.cr.timeout = o.ReadTimeout
	return nil
}

func errorReason(data []byte) string {
	if len(data) == 0 || int(data[0]) > len(data)-1 {
		return string(data)
	}
	return string(data[1 : 1+int(data[0])])
}

// readLoop reads until the connection fails and returns why.
func (c *conn) readLoop() error {
	s := c.s
	for {
		var dst [][]byte
		if s.kind == kindRouter {
			dst = make([][]byte, 1, 4)
			dst[0] = c.id
		}
		frames, cmd, held, err := c.rd.readMsg(dst)
		if err != nil {
			s.budget.release(held)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: within %v", ErrReadTimeout, s.o.ReadTimeout)
			}
			return err
		}
		switch {
		case cmd:
			err = c.onCommand(frames[0])
			s.budget.release(held)
		case s.kind == kindPub:
			err = c.onSubscriptionMsg(frames)
			s.budget.release(held)
		case s.kind == kindSub && !s.subList.Load().match(frames[0]):
			s.budget.release(held)
		default:
			err = s.deliver(c, frames, held)
		}
		if err != nil {
			return err
		}
	}
}

func (c *conn) onCommand(body []byte) error {
	name, data, err := parseCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "PING":
		// TTL (2 bytes), then up to 16 bytes of context to echo.
		if len(data) < 2 || len(data) > 18 {
			return fmt.Errorf("%w: PING of %d bytes", ErrProtocol, len(data))
		}
		c.enqueue(outMsg{frames: [][]byte{command("PONG", data[2:])}, cmd: true})
	case "ERROR":
		return fmt.Errorf("%w: peer sent ERROR %q", ErrProtocol, errorReason(data))
	case "SUBSCRIBE", "CANCEL":
		if c.s.kind == kindPub {
			return c.subscribe(name == "SUBSCRIBE", data)
		}
	}
	// PONG, READY again and unknown commands are ignored.
	return nil
}

// onSubscriptionMsg handles a message a Pub receives: ZMTP 3.0's
// subscription form, 0x01 (subscribe) or 0x00 (cancel) then the prefix.
// Anything else is ignored.
func (c *conn) onSubscriptionMsg(frames [][]byte) error {
	if len(frames) != 1 || len(frames[0]) == 0 || frames[0][0] > 1 {
		return nil
	}
	return c.subscribe(frames[0][0] == 1, frames[0][1:])
}

func (c *conn) subscribe(on bool, prefix []byte) error {
	_, had := c.subMap[string(prefix)]
	switch {
	case on == had:
		return nil
	case on && len(c.subMap) >= c.s.o.MaxSubscriptions:
		return fmt.Errorf("%w: more than %d subscriptions", ErrProtocol, c.s.o.MaxSubscriptions)
	case on:
		c.subMap[string(prefix)] = struct{}{}
	default:
		delete(c.subMap, string(prefix))
	}
	c.subs.Store(newSubSet(c.subMap))
	return nil
}

// subscription is a Sub's (un)subscribe in the form the peer's version
// expects: a command for 3.1, a message for 3.0.
func (c *conn) subscription(on bool, prefix []byte) outMsg {
	if c.minor >= 1 {
		name := "CANCEL"
		if on {
			name = "SUBSCRIBE"
		}
		return outMsg{frames: [][]byte{command(name, prefix)}, cmd: true}
	}
	flag := byte(0)
	if on {
		flag = 1
	}
	return outMsg{frames: [][]byte{append([]byte{flag}, prefix...)}}
}

// enqueue queues m without waiting; false when the queue is full.
func (c *conn) enqueue(m outMsg) bool {
	select {
	case c.out <- m:
		return true
	default:
		return false
	}
}

// writeLoop writes queued messages, flushing when the queue runs dry. A
// peer that accepts nothing for WriteTimeout is disconnected.
func (c *conn) writeLoop() {
	defer c.s.wg.Done()
	shared := c.s.shared // nil but for a Dealer
	timeout := c.s.o.WriteTimeout
	for {
		var m outMsg
		select {
		case m = <-c.out:
		case m = <-shared:
		case <-c.done:
			return
		}
		armed := time.Now()
		_ = c.nc.SetWriteDeadline(armed.Add(timeout))
		for {
			if err := writeFrames(c.bw, m.frames, m.cmd); err != nil {
				c.writeFailed(err)
				return
			}
			if !m.cmd {
				c.sent.Add(1)
				c.s.st.sent.Add(1)
			}
			more := true
			select {
			case m = <-c.out:
			case m = <-shared:
			default:
				more = false
			}
			if !more {
				break
			}
			if now := time.Now(); now.Sub(armed) > timeout/4 {
				armed = now
				_ = c.nc.SetWriteDeadline(now.Add(timeout))
			}
		}
		if err := c.bw.Flush(); err != nil {
			c.writeFailed(err)
			return
		}
	}
}

func (c *conn) writeFailed(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: no progress for %v", ErrWriteTimeout, c.s.o.WriteTimeout)
	}
	c.close(err)
}
