package httpserve

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// limitListener accepts at most cap(sem) connections at once. When full,
// Accept waits (the connection stays in the kernel's accept queue and
// costs no file descriptor) and calls onFull at once and then every
// shedEvery while it waits, so the server can close idle connections;
// onRoom is called when a connection closes and the count falls to the low
// mark.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	full      atomic.Bool // onFull was called and onRoom not since
	onFull    func()
	onRoom    func()
	shedEvery time.Duration
}

func newLimitListener(ln net.Listener, n int, onFull, onRoom func()) *limitListener {
	return &limitListener{
		Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{}),
		onFull: onFull, onRoom: onRoom, shedEvery: time.Second,
	}
}

func (l *limitListener) acquire() bool {
	select {
	case l.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTicker(l.shedEvery)
	defer t.Stop()
	for {
		l.full.Store(true)
		l.onFull()
		select {
		case l.sem <- struct{}{}:
			return true
		case <-l.done:
			return false
		case <-t.C:
		}
	}
}

func (l *limitListener) release() {
	<-l.sem
	if len(l.sem) <= cap(l.sem)*3/4 && l.full.CompareAndSwap(true, false) {
		l.onRoom()
	}
}

func (l *limitListener) Accept() (net.Conn, error) {
	if !l.acquire() {
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		l.release()
		return nil, err
	}
	return &limitConn{Conn: c, l: l}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// open is the number of connections counted.
func (l *limitListener) open() int { return len(l.sem) }

type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}
