// Package httpserve is the HTTP server every kvgate server runs (engine
// emulator, kvindex admin, gateway): header, body, write and idle
// timeouts, a connection limit that sheds idle connections under pressure,
// a header size bound, and a body reader that caps bodies with a 413 and
// bounds how many large bodies are processed at once (BodyLimiter).
//
// Timeouts are per request, not the net/http server-wide ReadTimeout and
// WriteTimeout, which would cut long SSE streams: the body read deadline is
// lifted once the body has been read, and the write deadline is renewed on
// every write.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Server is an *http.Server with Config's protections.
type Server struct {
	// HTTP is the underlying server; set BaseContext, ErrorLog and the like
	// before Serve. Do not call its Serve or ListenAndServe: use Serve.
	HTTP *http.Server
	cfg  Config
	ln   *limitListener
}

// New builds a server for h. cfg's zero fields take defaults.
func New(cfg Config, h http.Handler) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	s := &Server{cfg: cfg}
	s.HTTP = &http.Server{
		Handler:           Deadlines(cfg, h),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
	}
	return s, nil
}

// Config is the server's configuration, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Serve accepts connections on ln, at most Config.MaxConns at once, until
// Shutdown or Close; it returns http.ErrServerClosed then.
func (s *Server) Serve(ln net.Listener) error {
	if s.ln != nil {
		return fmt.Errorf("httpserve: Serve called twice")
	}
	s.ln = newLimitListener(ln, s.cfg.MaxConns,
		func() { s.HTTP.SetKeepAlivesEnabled(false) }, // closes idle and silent connections now
		func() { s.HTTP.SetKeepAlivesEnabled(true) })
	return s.HTTP.Serve(s.ln)
}

// Shutdown stops gracefully (see http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error { return s.HTTP.Shutdown(ctx) }

// Close stops at once (see http.Server.Close).
func (s *Server) Close() error { return s.HTTP.Close() }

// Deadlines wraps h with the per-request deadlines of cfg (defaults filled
// in): the body must arrive within ReadTimeout (the deadline is lifted at
// its end, so the server's watch for a client going away has none), and
// every write must complete within WriteTimeout of its start. A server
// built by New has it; use it directly to mount handlers elsewhere.
func Deadlines(cfg Config, h http.Handler) http.Handler {
	cfg = cfg.WithDefaults()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		// A deadline left from an earlier request on this connection must
		// not hit a slow handler's first write.
		_ = rc.SetWriteDeadline(time.Time{})
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			if rc.SetReadDeadline(time.Now().Add(cfg.ReadTimeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			}
		}
		dw := &deadlineWriter{ResponseWriter: w, rc: rc, d: cfg.WriteTimeout}
		defer func() { _ = rc.SetWriteDeadline(time.Now().Add(cfg.WriteTimeout)) }() // the final flush
		h.ServeHTTP(dw, r)
	})
}

// deadlineBody lifts the read deadline when the body has been read to
// its end. Errors (a deadline that expired, a limit) leave it in place.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done && errors.Is(err, io.EOF) {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.ReadCloser.Close() }

// deadlineWriter renews the write deadline before writes: to now +
// d, whenever less than half of d is left.
type deadlineWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	d        time.Duration
	deadline time.Time
}

func (w *deadlineWriter) renew() {
	now := time.Now()
	if w.deadline.Sub(now) < w.d/2 {
		w.deadline = now.Add(w.d)
		_ = w.rc.SetWriteDeadline(w.deadline)
	}
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.renew()
	return w.ResponseWriter.Write(p)
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.renew()
	w.ResponseWriter.WriteHeader(code)
}

// Flush renews the deadline and flushes (http.Flusher).
func (w *deadlineWriter) Flush() {
	w.renew()
	_ = w.rc.Flush()
}

// FlushError is Flush with its error (used by http.ResponseController).
func (w *deadlineWriter) FlushError() error {
	w.renew()
	return w.rc.Flush()
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
