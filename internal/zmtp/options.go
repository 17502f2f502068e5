package zmtp

import (
	"fmt"
	"log/slog"
	"net"
	"time"
)

// Defaults of Options; see the field comments.
const (
	DefaultMaxMsgSize        = 16 << 20
	DefaultMaxFrames         = 16
	DefaultMaxPeers          = 256
	DefaultSendQueue         = 1000
	DefaultRecvQueue         = 1000
	DefaultHandshakeTimeout  = 5 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultReconnectInterval = 100 * time.Millisecond
	DefaultReconnectMax      = 5 * time.Second
	DefaultMaxSubscriptions  = 1024

	// MaxMsgSizeLimit is the largest MaxMsgSize accepted.
	MaxMsgSizeLimit = 1 << 30
	// maxCommandSize bounds a command frame (READY, SUBSCRIBE, PING, ...).
	maxCommandSize = 64 << 10
)

// Options configures a socket. The zero value of each field selects its
// default.
type Options struct {
	// MaxMsgSize is the largest message (all its frames together) accepted
	// from a peer, in bytes; a peer announcing more is disconnected before
	// the body is read. Default 16 MiB, at most 1 GiB. Outgoing messages are
	// not limited.
	MaxMsgSize int64
	// MaxFrames is the most frames a received message may have. Default 16.
	MaxFrames int
	// MaxPeers bounds the connections a bound socket holds at once
	// (handshaking or established); more are closed on accept and counted
	// as refused. Default 256. Dialed connections do not count.
	MaxPeers int
	// SendQueue is each peer's outgoing queue, in messages (Dealer: the
	// socket's). A Pub drops messages for a peer whose queue is full; a
	// Router or Dealer Send waits for room. Default 1000.
	SendQueue int
	// RecvQueue is the received-message queue, in messages. Default 1000.
	RecvQueue int
	// RecvBuffer bounds the bytes of received messages queued and being
	// read, for the whole socket; a message being read holds what has
	// arrived of it (at most twice that, plus 64 bytes per frame), not
	// what its headers announce. A peer that cannot get room within
	// ReadTimeout is disconnected. Default and minimum: 4 × MaxMsgSize
	// (at least 2 × (MaxMsgSize + MaxFrames × 64 B + 64 KiB)).
	RecvBuffer int64
	// HandshakeTimeout bounds the greeting and READY exchange. Default 5 s.
	HandshakeTimeout time.Duration
	// WriteTimeout: a peer whose connection accepts no message for this
	// long is disconnected. Default 10 s.
	WriteTimeout time.Duration
	// ReadTimeout: once the first byte of a message has arrived, the rest
	// must arrive within this long (an idle peer is never timed out).
	// Default 30 s.
	ReadTimeout time.Duration
	// ReconnectInterval and ReconnectMax bound the backoff between dial
	// attempts (doubling from the first to the second). Defaults 100 ms
	// and 5 s.
	ReconnectInterval, ReconnectMax time.Duration
	// MaxSubscriptions bounds the distinct subscriptions a Pub keeps per
	// peer; a peer sending more is disconnected. Default 1024.
	MaxSubscriptions int
	// Identity is sent in READY (Dealer); at most 255 bytes.
	Identity []byte
	// OnConnect, when set, is called after each completed handshake, and
	// OnDisconnect when an established connection ends (err says why; nil
	// on Close). They run on the connection's goroutine and must not block.
	OnConnect    func(remote net.Addr)
	OnDisconnect func(remote net.Addr, err error)
	// Logger receives warnings (rate-limited) and debug events; nil means
	// slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	switch {
	case o.MaxMsgSize < 0 || o.MaxMsgSize > MaxMsgSizeLimit:
		return o, fmt.Errorf("zmtp: MaxMsgSize %d out of range [1, %d]", o.MaxMsgSize, MaxMsgSizeLimit)
	case o.MaxFrames < 0 || o.MaxFrames > 1<<16:
		return o, fmt.Errorf("zmtp: MaxFrames %d out of range [1, 65536]", o.MaxFrames)
	case o.MaxPeers < 0 || o.MaxPeers > 1<<20:
		return o, fmt.Errorf("zmtp: MaxPeers %d out of range [1, 1048576]", o.MaxPeers)
	case o.SendQueue < 0 || o.SendQueue > 1<<20 || o.RecvQueue < 0 || o.RecvQueue > 1<<20:
		return o, fmt.Errorf("zmtp: queue lengths out of range [1, 1048576]")
	case o.RecvBuffer < 0 || o.RecvBuffer > 1<<40:
		return o, fmt.Errorf("zmtp: RecvBuffer %d out of range", o.RecvBuffer)
	case o.HandshakeTimeout < 0 || o.WriteTimeout < 0 || o.ReadTimeout < 0 || o.ReconnectInterval < 0 || o.ReconnectMax < 0:
		return o, fmt.Errorf("zmtp: negative timeout")
	case o.MaxSubscriptions < 0 || o.MaxSubscriptions > 1<<20:
		return o, fmt.Errorf("zmtp: MaxSubscriptions %d out of range [1, 1048576]", o.MaxSubscriptions)
	case len(o.Identity) > 255:
		return o, fmt.Errorf("zmtp: identity of %d bytes, at most 255", len(o.Identity))
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if o.MaxMsgSize == 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	def(&o.MaxFrames, DefaultMaxFrames)
	def(&o.MaxPeers, DefaultMaxPeers)
	def(&o.SendQueue, DefaultSendQueue)
	def(&o.RecvQueue, DefaultRecvQueue)
	def(&o.MaxSubscriptions, DefaultMaxSubscriptions)
	// Room for several largest messages, and for one with every frame's
	// overhead and a command on top.
	o.RecvBuffer = max(o.RecvBuffer, 4*o.MaxMsgSize, 2*(o.MaxMsgSize+int64(o.MaxFrames)*frameOverhead+maxCommandSize))
	defDur(&o.HandshakeTimeout, DefaultHandshakeTimeout)
	defDur(&o.WriteTimeout, DefaultWriteTimeout)
	defDur(&o.ReadTimeout, DefaultReadTimeout)
	defDur(&o.ReconnectInterval, DefaultReconnectInterval)
	defDur(&o.ReconnectMax, DefaultReconnectMax)
	o.ReconnectMax = max(o.ReconnectMax, o.ReconnectInterval)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
