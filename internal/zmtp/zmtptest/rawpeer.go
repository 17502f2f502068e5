// Package zmtptest is a test helper: a ZMTP 3 peer built by hand from raw
// bytes, independent of package zmtp, that can misbehave on purpose
// (announce huge frames, subscribe and never read, request a replay and
// never read). Only tests import it.
package zmtptest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// Peer is a raw TCP connection that has completed (or will complete) a
// ZMTP 3.x NULL handshake.
type Peer struct {
	Conn  net.Conn
	r     *bufio.Reader
	Minor byte // the minor version the other side announced
}

// Dial connects to a tcp:// endpoint (or host:port).
func Dial(endpoint string, timeout time.Duration) (*Peer, error) {
	addr := strings.TrimPrefix(endpoint, "tcp://")
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return NewPeer(c), nil
}

// NewPeer wraps an established connection (e.g. one a test accepted).
func NewPeer(c net.Conn) *Peer { return &Peer{Conn: c, r: bufio.NewReader(c)} }

// Greeting is a 64-byte ZMTP greeting announcing version 3.minor and the
// NULL mechanism.
func Greeting(minor byte) []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, minor
	copy(g[12:], "NULL")
	return g
}

// Handshake sends a greeting announcing 3.minor and a READY with the given
// socket type (and identity, when not nil), then reads the other side's
// greeting and READY. It fails on an ERROR command.
func (p *Peer) Handshake(socketType string, minor byte, identity []byte, timeout time.Duration) error {
	_ = p.Conn.SetDeadline(time.Now().Add(timeout))
	defer p.Conn.SetDeadline(time.Time{})
	if _, err := p.Conn.Write(Greeting(minor)); err != nil {
		return err
	}
	props := Property("Socket-Type", []byte(socketType))
	if identity != nil {
		props = append(props, Property("Identity", identity)...)
	}
	if err := p.WriteCommand("READY", props); err != nil {
		return err
	}
	if err := p.ReadGreeting(); err != nil {
		return err
	}
	name, body, err := p.ReadCommand()
	if err != nil {
		return err
	}
	if name != "READY" {
		return fmt.Errorf("got %s %q, want READY", name, body)
	}
	return nil
}

// ReadGreeting reads the other side's greeting and records its minor
// version.
func (p *Peer) ReadGreeting() error {
	var g [64]byte
	if _, err := io.ReadFull(p.r, g[:]); err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	if g[0] != 0xff || g[9]&1 == 0 || g[10] < 3 || string(g[12:16]) != "NULL" {
		return fmt.Errorf("bad greeting % x", g[:16])
	}
	p.Minor = g[11]
	return nil
}

// Property encodes one READY metadata property.
func Property(name string, value []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// FrameHeader encodes a frame header with the given flags (1 more, 4
// command) announcing size bytes; the long form is used when size > 255 or
// long is set.
func FrameHeader(flags byte, size uint64, long bool) []byte {
	if size > 255 || long {
		return binary.BigEndian.AppendUint64([]byte{flags | 2}, size)
	}
	return []byte{flags, byte(size)}
}

// WriteCommand writes a command frame.
func (p *Peer) WriteCommand(name string, data []byte) error {
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, data...)
	_, err := p.Conn.Write(append(FrameHeader(4, uint64(len(body)), false), body...))
	return err
}

// WriteMsg writes a message of ordinary frames.
func (p *Peer) WriteMsg(frames ...[]byte) error {
	var b []byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = 1
		}
		b = append(b, FrameHeader(flags, uint64(len(f)), false)...)
		b = append(b, f...)
	}
	_, err := p.Conn.Write(b)
	return err
}

// Write writes raw bytes.
func (p *Peer) Write(b []byte) error {
	_, err := p.Conn.Write(b)
	return err
}

// readFrame reads one frame; it refuses frames over 64 MiB.
func (p *Peer) readFrame() (flags byte, body []byte, err error) {
	flags, err = p.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	var size uint64
	if flags&2 != 0 {
		var b [8]byte
		if _, err = io.ReadFull(p.r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		s, err := p.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(s)
	}
	if size > 64<<20 {
		return 0, nil, fmt.Errorf("frame of %d bytes", size)
	}
	body = make([]byte, size)
	_, err = io.ReadFull(p.r, body)
	return flags, body, err
}

// ReadCommand reads one command frame and splits it into name and data.
func (p *Peer) ReadCommand() (string, []byte, error) {
	flags, body, err := p.readFrame()
	if err != nil {
		return "", nil, err
	}
	if flags&4 == 0 || len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("not a command: flags %#x, % x", flags, body)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// ReadMsg reads one message, skipping command frames.
func (p *Peer) ReadMsg() ([][]byte, error) {
	var frames [][]byte
	for {
		flags, body, err := p.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&4 != 0 {
			continue
		}
		frames = append(frames, body)
		if flags&1 == 0 {
			return frames, nil
		}
	}
}

// WaitClosed reports whether the other side closes the connection within
// timeout (reading and discarding whatever it sends).
func (p *Peer) WaitClosed(timeout time.Duration) bool {
	_ = p.Conn.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.Copy(io.Discard, p.r)
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// Close closes the connection.
func (p *Peer) Close() error { return p.Conn.Close() }

// Eventually polls f every 5 ms until it holds, failing the test after
// timeout (a hang guard, never a speed assertion).
func Eventually(t testing.TB, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
