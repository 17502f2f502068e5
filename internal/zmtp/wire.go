package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Errors a socket returns or reports through OnDisconnect.
var (
	ErrClosed        = errors.New("zmtp: socket closed")
	ErrTooLarge      = errors.New("zmtp: message larger than the limit")
	ErrTooManyFrames = errors.New("zmtp: message has more frames than the limit")
	ErrProtocol      = errors.New("zmtp: protocol error")
	ErrHandshake     = errors.New("zmtp: handshake failed")
	ErrNoPeer        = errors.New("zmtp: no such peer")
	ErrRecvBuffer    = errors.New("zmtp: receive buffer full")
)

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

const (
	greetingSize = 64
	// frameOverhead is what a received frame costs beyond its bytes, for
	// the receive budget.
	frameOverhead = 64
)

// greeting is the 64-byte ZMTP greeting: signature, version 3.1, mechanism
// NULL, as-server 0, filler.
func greeting() []byte {
	g := make([]byte, greetingSize)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 1
	copy(g[12:32], "NULL")
	return g
}

// readGreeting reads the peer's greeting and returns the minor version the
// two sides speak (0 or 1).
func readGreeting(r io.Reader) (minor byte, err error) {
	var g [greetingSize]byte
	if _, err := io.ReadFull(r, g[:11]); err != nil {
		return 0, fmt.Errorf("%w: greeting: %w", ErrHandshake, err)
	}
	if g[0] != 0xff || g[9]&1 == 0 {
		return 0, fmt.Errorf("%w: not a ZMTP 3 peer (signature % x)", ErrHandshake, g[:10])
	}
	if g[10] < 3 {
		return 0, fmt.Errorf("%w: peer speaks ZMTP %d.x, 3.0 or later is needed", ErrHandshake, g[10])
	}
	if _, err := io.ReadFull(r, g[11:]); err != nil {
		return 0, fmt.Errorf("%w: greeting: %w", ErrHandshake, err)
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return 0, fmt.Errorf("%w: mechanism %q, only NULL is supported", ErrHandshake, mech)
	}
	minor = g[11]
	if g[10] > 3 || minor > 1 {
		minor = 1 // a newer peer talks down to us
	}
	return minor, nil
}

// command builds a command body: name length, name, data.
func command(name string, data ...[]byte) []byte {
	n := 1 + len(name)
	for _, d := range data {
		n += len(d)
	}
	b := make([]byte, 0, n)
	b = append(append(b, byte(len(name))), name...)
	for _, d := range data {
		b = append(b, d...)
	}
	return b
}

// parseCommand splits a command body into name and data.
func parseCommand(body []byte) (name string, data []byte, err error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: malformed command", ErrProtocol)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// property encodes one READY metadata property.
func property(name string, value []byte) []byte {
	b := make([]byte, 0, 1+len(name)+4+len(value))
	b = append(append(b, byte(len(name))), name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// parseProperties calls fn for each READY property (names compared
// case-insensitively by the caller).
func parseProperties(data []byte, fn func(name string, value []byte)) error {
	for len(data) > 0 {
		n := int(data[0])
		if len(data) < 1+n+4 {
			return fmt.Errorf("%w: malformed READY property", ErrProtocol)
		}
		name := string(data[1 : 1+n])
		vl := binary.BigEndian.Uint32(data[1+n:])
		rest := data[1+n+4:]
		if uint64(vl) > uint64(len(rest)) {
			return fmt.Errorf("%w: READY property %q of %d bytes, %d left", ErrProtocol, name, vl, len(rest))
		}
		fn(name, rest[:vl])
		data = rest[vl:]
	}
	return nil
}

// writeFrames writes a message (or, with cmd, one command frame) to w.
func writeFrames(w *bufio.Writer, frames [][]byte, cmd bool) error {
	var hdr [9]byte
	for i, f := range frames {
		var flags byte
		switch {
		case cmd:
			flags = flagCommand
		case i < len(frames)-1:
			flags = flagMore
		}
		h := hdr[:2]
		if len(f) > 255 {
			hdr[0] = flags | flagLong
			binary.BigEndian.PutUint64(hdr[1:], uint64(len(f)))
			h = hdr[:9]
		} else {
			hdr[0], hdr[1] = flags, byte(len(f))
		}
		if _, err := w.Write(h); err != nil {
			return err
		}
		if _, err := w.Write(f); err != nil {
			return err
		}
	}
	return nil
}

// connReader arms a read deadline once a message has started, so an idle
// peer waits forever but a half-sent message does not.
type connReader struct {
	nc      net.Conn
	timeout time.Duration // 0: no message deadline (during the handshake)
	inMsg   bool
	armed   bool
}

func (c *connReader) Read(p []byte) (int, error) {
	if c.inMsg && !c.armed && c.timeout > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.timeout))
		c.armed = true
	}
	return c.nc.Read(p)
}

// rearm makes the next read of the message set a fresh deadline.
func (c *connReader) rearm() {
	if c.armed {
		_ = c.nc.SetReadDeadline(time.Time{})
		c.armed = false
	}
}

func (c *connReader) endMsg() {
	c.inMsg = false
	c.rearm()
}

// msgReader reads frames within limits. Each frame's bytes are taken from
// the budget before its body is read; the caller gives them back.
type msgReader struct {
	br        *bufio.Reader
	cr        *connReader // nil: no message deadline
	maxMsg    uint64
	maxFrames int
	budget    *budget // nil: unbounded
	done      <-chan struct{}
	wait      time.Duration // longest wait for budget without a backlog
	backlog   func() bool   // whether received messages wait for Recv
}

// readMsg reads one message, appending its frames to dst, or one command
// frame (cmd true, one frame). held is what it took from the budget, also
// on error.
func (r *msgReader) readMsg(dst [][]byte) (frames [][]byte, cmd bool, held int64, err error) {
	frames = dst
	var total uint64
	n := 0
	defer func() {
		if r.cr != nil {
			r.cr.endMsg()
		}
	}()
	for {
		flags, err := r.br.ReadByte()
		if err != nil {
			return nil, false, held, err
		}
		if r.cr != nil {
			r.cr.inMsg = true
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(r.br, b[:]); err != nil {
				return nil, false, held, err
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := r.br.ReadByte()
			if err != nil {
				return nil, false, held, err
			}
			size = uint64(b)
		}
		isCmd := flags&flagCommand != 0
		switch {
		case isCmd && (n > 0 || flags&flagMore != 0):
			return nil, false, held, fmt.Errorf("%w: command frame inside a message", ErrProtocol)
		case isCmd && size > maxCommandSize:
			return nil, false, held, fmt.Errorf("%w: command of %d bytes, limit %d", ErrTooLarge, size, maxCommandSize)
		case !isCmd && size > r.maxMsg-total:
			return nil, false, held, fmt.Errorf("%w: frame of %d bytes after %d, limit %d", ErrTooLarge, size, total, r.maxMsg)
		case !isCmd && n >= r.maxFrames:
			return nil, false, held, fmt.Errorf("%w: more than %d frames", ErrTooManyFrames, r.maxFrames)
		}
		if r.budget != nil {
			took, err := r.take(frameOverhead)
			if err != nil {
				return nil, false, held, err
			}
			held += took
		}
		body, took, err := r.readBody(int(size))
		held += took
		if err != nil {
			return nil, false, held, err
		}
		frames = append(frames, body)
		if isCmd {
			return frames, true, held, nil
		}
		total += size
		n++
		if flags&flagMore == 0 {
			return frames, false, held, nil
		}
	}
}

// take takes n bytes from the budget. While Recv has messages to take
// (backlog), waiting is backpressure and lasts as long as it must;
// otherwise the budget is held by half-read messages, which may never
// complete, and after r.wait the peer is given up.
func (r *msgReader) take(n int64) (int64, error) {
	if took, ok := r.budget.tryAcquire(n); ok {
		return took, nil
	}
	if r.cr != nil {
		defer r.cr.rearm() // the wait does not count against the message's deadline
	}
	for {
		took, err := r.budget.acquire(n, r.done, r.wait)
		if err == nil || !errors.Is(err, ErrRecvBuffer) || r.backlog == nil || !r.backlog() {
			return took, err
		}
	}
}

// readBody reads an n-byte frame body. Its buffer grows only with bytes
// that have arrived (waiting for the rest of the frame, or for a read
// buffer full of it, then at most doubling), and each growth takes receive
// budget first. So a size a peer announces but does not send costs neither
// memory nor budget: a peer holds at most twice what it sent, and peers
// that announce large frames and trickle cannot starve the others. held is
// the budget taken, also on error.
func (r *msgReader) readBody(n int) (body []byte, held int64, err error) {
	b := []byte{}
	for len(b) < n {
		if len(b) == cap(b) {
			// Wait for the rest of the frame, or a buffer full of it.
			if _, err := r.br.Peek(min(n-len(b), r.br.Size())); err != nil {
				return nil, held, unexpectedEOF(err)
			}
			c := min(n, max(2*cap(b), len(b)+r.br.Buffered()))
			if r.budget != nil {
				took, err := r.take(int64(c - cap(b)))
				held += took
				if err != nil {
					return nil, held, err
				}
			}
			nb := make([]byte, len(b), c)
			copy(nb, b)
			b = nb
		}
		// From the buffer, or (for large bodies) straight from the
		// connection into the room already taken.
		m, err := r.br.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			return nil, held, unexpectedEOF(err)
		}
	}
	return b, held, nil
}

// unexpectedEOF: the connection ended inside a frame.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseEndpoint turns tcp://host:port into host:port; for a bind, host *
// means every interface.
// CheckEndpoint reports whether ep is an endpoint the sockets accept:
// tcp://HOST:PORT, HOST "*" only to bind.
func CheckEndpoint(ep string, bind bool) error {
	_, err := parseEndpoint(ep, bind)
	return err
}

func parseEndpoint(ep string, bind bool) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("zmtp: endpoint %q: only tcp://host:port is supported", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || port == "" {
		return "", fmt.Errorf("zmtp: endpoint %q: %v", ep, err)
	}
	if host == "*" {
		if !bind {
			return "", fmt.Errorf("zmtp: endpoint %q: cannot dial *", ep)
		}
		host = ""
	}
	if host == "" && !bind {
		return "", fmt.Errorf("zmtp: endpoint %q: no host to dial", ep)
	}
	return net.JoinHostPort(host, port), nil
}
