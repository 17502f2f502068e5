package zmtp

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Pub is a PUB socket: it binds, and Send fans a message out to every peer
// subscribed to a prefix of its first frame without ever blocking.
type Pub struct{ s *socket }

// NewPub creates a PUB socket.
func NewPub(o Options) (*Pub, error) {
	s, err := newSocket(kindPub, o)
	if err != nil {
		return nil, err
	}
	return &Pub{s}, nil
}

// Bind listens on a tcp://host:port endpoint (host * for every interface,
// port 0 for a free port) and returns the bound address.
func (p *Pub) Bind(endpoint string) (net.Addr, error) { return p.s.bind(endpoint) }

// Send queues a message for every subscribed peer. A peer whose queue is
// full misses it (counted in Stats, per peer and in total). The frames are
// written after Send returns: the caller must not modify them.
func (p *Pub) Send(frames ...[]byte) error {
	if len(frames) == 0 {
		return errors.New("zmtp: empty message")
	}
	if p.s.ctx.Err() != nil {
		return ErrClosed
	}
	m := outMsg{frames: frames}
	for _, c := range *p.s.ready.Load() {
		if !c.subs.Load().match(frames[0]) {
			continue
		}
		if !c.enqueue(m) {
			c.dropped.Add(1)
			p.s.st.dropped.Add(1)
		}
	}
	return nil
}

// Stats returns the socket's counters.
func (p *Pub) Stats() Stats { return p.s.stats() }

// Close closes the socket and its connections and waits for its
// goroutines.
func (p *Pub) Close() error { return p.s.close() }

// Sub is a SUB socket: it dials and/or binds, subscribes by prefix and
// receives the matching messages of every peer.
type Sub struct{ s *socket }

// NewSub creates a SUB socket.
func NewSub(o Options) (*Sub, error) {
	s, err := newSocket(kindSub, o)
	if err != nil {
		return nil, err
	}
	return &Sub{s}, nil
}

// Bind listens on endpoint for publishers.
func (b *Sub) Bind(endpoint string) (net.Addr, error) { return b.s.bind(endpoint) }

// Dial connects to a publisher in the background, reconnecting with
// backoff until Close. It fails only for a malformed endpoint.
func (b *Sub) Dial(endpoint string) error { return b.s.dial(endpoint) }

// Subscribe receives messages whose first frame starts with prefix (the
// empty prefix: everything). Subscriptions are a set.
func (b *Sub) Subscribe(prefix []byte) { b.setSub(true, prefix) }

// Unsubscribe cancels Subscribe(prefix).
func (b *Sub) Unsubscribe(prefix []byte) { b.setSub(false, prefix) }

func (b *Sub) setSub(on bool, prefix []byte) {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, had := s.subs[string(prefix)]; had == on {
		return
	}
	if on {
		s.subs[string(prefix)] = struct{}{}
	} else {
		delete(s.subs, string(prefix))
	}
	s.subList.Store(newSubSet(s.subs))
	for _, c := range *s.ready.Load() {
		if !c.enqueue(c.subscription(on, prefix)) {
			// The peer is not reading; it resubscribes when it reconnects.
			c.close(fmt.Errorf("%w: send queue full", ErrWriteTimeout))
		}
	}
}

// Recv returns the next message.
func (b *Sub) Recv(ctx context.Context) ([][]byte, error) {
	f, _, err := b.s.recv(ctx)
	return f, err
}

// RecvFrom returns the next message and the remote address of the peer
// that sent it (for a bound socket, the publisher's address as dialed
// from; ports of dialing peers are ephemeral, their IP is not).
func (b *Sub) RecvFrom(ctx context.Context) ([][]byte, net.Addr, error) { return b.s.recv(ctx) }

// Connected reports whether a peer at remote (an address RecvFrom gave)
// is connected now.
func (b *Sub) Connected(remote net.Addr) bool { return b.s.connected(remote) }

// Addr is the first bound address, or nil.
func (b *Sub) Addr() net.Addr { return b.s.addr() }

// Stats returns the socket's counters.
func (b *Sub) Stats() Stats { return b.s.stats() }

// Close closes the socket and waits for its goroutines.
func (b *Sub) Close() error { return b.s.close() }

// Router is a ROUTER socket: it binds; each received message starts with
// the sending peer's routing id, and Send's first frame names the peer.
type Router struct{ s *socket }

// NewRouter creates a ROUTER socket.
func NewRouter(o Options) (*Router, error) {
	s, err := newSocket(kindRouter, o)
	if err != nil {
		return nil, err
	}
	return &Router{s}, nil
}

// Bind listens on endpoint.
func (r *Router) Bind(endpoint string) (net.Addr, error) { return r.s.bind(endpoint) }

// Recv returns the next message, [routing id, frames...].
func (r *Router) Recv(ctx context.Context) ([][]byte, error) {
	f, _, err := r.s.recv(ctx)
	return f, err
}

// Send sends frames[1:] to the peer whose routing id is frames[0], waiting
// while that peer's queue is full. It fails with ErrNoPeer when the peer is
// not (or no longer) connected. The frames must not be modified after.
func (r *Router) Send(ctx context.Context, frames ...[]byte) error {
	if len(frames) < 2 {
		return errors.New("zmtp: a routed message needs an id and a frame")
	}
	r.s.mu.Lock()
	c := r.s.byID[string(frames[0])]
	r.s.mu.Unlock()
	if c == nil {
		return ErrNoPeer
	}
	select {
	case c.out <- outMsg{frames: frames[1:]}:
		return nil
	case <-c.done:
		return ErrNoPeer
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the socket's counters.
func (r *Router) Stats() Stats { return r.s.stats() }

// Close closes the socket and waits for its goroutines.
func (r *Router) Close() error { return r.s.close() }

// Dealer is a DEALER socket: it dials (reconnecting) and sends to whichever
// peer is connected.
type Dealer struct{ s *socket }

// NewDealer creates a DEALER socket.
func NewDealer(o Options) (*Dealer, error) {
	s, err := newSocket(kindDealer, o)
	if err != nil {
		return nil, err
	}
	return &Dealer{s}, nil
}

// Dial connects in the background, reconnecting with backoff until Close.
func (d *Dealer) Dial(endpoint string) error { return d.s.dial(endpoint) }

// Send queues a message, waiting while the queue is full; it is written
// once a peer is connected. The frames must not be modified after.
func (d *Dealer) Send(ctx context.Context, frames ...[]byte) error {
	if len(frames) == 0 {
		return errors.New("zmtp: empty message")
	}
	select {
	case d.s.shared <- outMsg{frames: frames}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.s.ctx.Done():
		return ErrClosed
	}
}

// Recv returns the next message.
func (d *Dealer) Recv(ctx context.Context) ([][]byte, error) {
	f, _, err := d.s.recv(ctx)
	return f, err
}

// Stats returns the socket's counters.
func (d *Dealer) Stats() Stats { return d.s.stats() }

// Close closes the socket and waits for its goroutines.
func (d *Dealer) Close() error { return d.s.close() }
