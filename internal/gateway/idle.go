package gateway

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The stream idle timeout (Config.StreamIdleTimeout). An engine that
// freezes in the middle of an answer (its API server stopped, a GPU
// hung) sends nothing more and closes nothing: its health checks take it
// out, but a stream already on it waits as long as its client does.
// Bounded, the silence breaks the attempt as a failed read does: the
// stream is continued elsewhere with --migration-limit, an answer
// assembled whole is sent again, and the engine is reported to health.
// The bound starts with the answer's first bytes: before them the engine
// may be queueing or computing a long prompt (no engine sends a byte
// before its first token), which --upstream-timeout bounds.

// errStreamIdle: the engine's answer was silent longer than
// --stream-idle-timeout.
var errStreamIdle = errors.New("the engine's answer was silent longer than --stream-idle-timeout")

// idleWatch cancels an attempt's upstream context when its answer stays
// silent for d once its first bytes came.
type idleWatch struct {
	d      time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	timer  *time.Timer
	done   bool
}

type idleKey struct{}

// watchIdle returns ctx, cancelled by an idle watch when the gateway has
// a stream idle timeout (the watch travels in the context to the relay,
// which touches it as the answer's bytes come), and the function that
// ends the watch.
func (g *Gateway) watchIdle(ctx context.Context) (context.Context, func()) {
	if g.cfg.StreamIdleTimeout <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	w := &idleWatch{d: g.cfg.StreamIdleTimeout, cancel: cancel}
	return context.WithValue(ctx, idleKey{}, w), func() {
		w.stop()
		cancel(nil)
	}
}

// idleWatchOf is ctx's idle watch (nil: none).
func idleWatchOf(ctx context.Context) *idleWatch {
	w, _ := ctx.Value(idleKey{}).(*idleWatch)
	return w
}

// touch (re)starts the silence the answer is allowed: its bytes came.
func (w *idleWatch) touch() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.done:
	case w.timer == nil:
		w.timer = time.AfterFunc(w.d, func() { w.cancel(errStreamIdle) })
	default:
		w.timer.Reset(w.d)
	}
}

func (w *idleWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// idled reports whether ctx was cancelled by its idle watch.
func idled(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errStreamIdle)
}
