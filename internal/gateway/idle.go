package gateway

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Each attempt at a request is watched (attemptWatch) for two ways an
// engine fails without saying so.
//
// Before the answer's first bytes, its engines must stay in: an engine
// that freezes (its API server stopped, a hung GPU) answers nothing and
// closes nothing, and the requests waiting on it waited as long as their
// clients did while the health checks had it out within seconds. When
// the health checks take one of the attempt's engines out, the attempt
// is called off and the request sent elsewhere, as a failure before the
// first byte is.
//
// After the first bytes, with a stream idle timeout
// (Config.StreamIdleTimeout), the answer must not stay silent longer:
// the attempt then breaks as a failed read does (the stream continued
// elsewhere with --migration-limit, an answer assembled whole sent
// again), and the engine is reported to health. The bound starts with
// the first bytes: before them the engine may be queueing or computing a
// long prompt (no engine sends a byte before its first token), which
// --upstream-timeout bounds.

// errStreamIdle: the engine's answer was silent longer than
// --stream-idle-timeout.
var errStreamIdle = errors.New("the engine's answer was silent longer than --stream-idle-timeout")

// errEngineOut: the health checks took the engine out before it answered.
var errEngineOut = errors.New("the engine was taken out (its health checks failed, or its requests did) before it answered")

// attemptWatch cancels an attempt's upstream context when one of its
// engines goes out before the answer's first bytes, or when the answer
// stays silent for d after them (d > 0).
type attemptWatch struct {
	d      time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	timer  *time.Timer
	done   bool // the attempt is over
	// unwatch stop the watches on the engines (context.AfterFunc's, no
	// goroutine a request), at the first bytes or the end.
	unwatch []func() bool
}

type attemptKey struct{}

// watchAttempt returns ctx, cancelled by the attempt's watch, which
// travels in the context to the relay (it touches the watch as the
// answer's bytes come), and the function that ends the watch. engines
// are the attempt's (nil ones skipped).
func (g *Gateway) watchAttempt(ctx context.Context, engines ...*member) (context.Context, func()) {
	if g.cfg.StreamIdleTimeout <= 0 && g.health == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	w := &attemptWatch{d: g.cfg.StreamIdleTimeout, cancel: cancel}
	if g.health != nil {
		for _, m := range engines {
			if m != nil {
				w.unwatch = append(w.unwatch, context.AfterFunc(m.goneContext(), func() { cancel(errEngineOut) }))
			}
		}
	}
	return context.WithValue(ctx, attemptKey{}, w), func() {
		w.stop()
		cancel(nil)
	}
}

// attemptWatchOf is ctx's attempt watch (nil: none).
func attemptWatchOf(ctx context.Context) *attemptWatch {
	w, _ := ctx.Value(attemptKey{}).(*attemptWatch)
	return w
}

// touch records that the answer's bytes came: the first stop the watch
// on its engines, and each (re)starts the silence allowed.
func (w *attemptWatch) touch() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.stopWatchingEngines() // the first bytes came
	switch {
	case w.d <= 0:
	case w.timer == nil:
		w.timer = time.AfterFunc(w.d, func() { w.cancel(errStreamIdle) })
	default:
		w.timer.Reset(w.d)
	}
}

// stopWatchingEngines ends the watches on the attempt's engines (under
// w.mu).
func (w *attemptWatch) stopWatchingEngines() {
	for _, stop := range w.unwatch {
		stop()
	}
	w.unwatch = nil
}

func (w *attemptWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopWatchingEngines()
	w.done = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// idled reports whether ctx was cancelled for its answer's silence.
func idled(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errStreamIdle)
}
