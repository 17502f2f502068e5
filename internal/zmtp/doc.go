// Package zmtp is kvgate's own ZeroMQ socket layer: ZMTP 3.0 and 3.1 over
// TCP with the NULL mechanism, for exactly the patterns kvgate uses.
//
//   - Pub binds; Send never blocks: each peer has a bounded queue, and a
//     message for a peer whose queue is full is dropped and counted for
//     that peer (a stalled subscriber never holds up the others).
//     Subscriptions arrive as 0x01/0x00-prefixed messages (ZMTP 3.0) or
//     SUBSCRIBE/CANCEL commands (3.1); both are accepted from any peer.
//   - Sub dials (reconnecting with backoff) and/or binds; it subscribes by
//     prefix, sending each peer the form its announced version expects,
//     and filters what it receives by the same prefixes.
//   - Router binds; received messages start with the peer's routing id,
//     and Send(ctx, id, ...) blocks only on that peer's queue.
//   - Dealer dials (reconnecting); Send queues for the connected peer.
//
// Every connection is bounded: a frame or message larger than
// Options.MaxMsgSize, or with more than Options.MaxFrames frames, makes the
// socket close the connection before the body is read; received bytes
// waiting in the socket or being read count against a per-socket budget
// (Options.RecvBuffer), taken as they arrive (bodies are read
// incrementally, so announcing a size neither allocates nor reserves
// anything, and peers that announce frames and trickle cannot starve the
// others); handshakes, writes and the rest of a message once it
// has started have deadlines; bound sockets accept at most Options.MaxPeers
// connections. Close stops every goroutine the socket started before it
// returns. Stats reports the counters (drops per peer, oversize
// rejections, refused connections, ...).
//
// Not supported: other transports (ipc, inproc), CURVE and PLAIN, ZMTP 1.0
// and 2.0 peers, and the socket types kvgate does not use.
package zmtp
