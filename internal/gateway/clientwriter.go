package gateway

import "net/http"

// clientWriter is the client's http.ResponseWriter under the gateway's
// own writers (the whole answer's assembly, the stream tap): it holds the
// answer's status until the first body bytes or flush, so that the
// gateway knows whether the client has any byte of an answer. One that
// has none (an engine that broke inside its stream's first line, which
// the tap holds back until whole) can still be answered by a retry on
// another engine (reset), or by an error with its status; net/http would
// otherwise have the status already and, aborted, send the client an
// empty reply.
type clientWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// base is the client's headers before any attempt's answer.
	base      http.Header
	status    int
	committed bool
}

func newClientWriter(w http.ResponseWriter) *clientWriter {
	return &clientWriter{w: w, rc: http.NewResponseController(w), base: w.Header().Clone()}
}

func (c *clientWriter) Header() http.Header { return c.w.Header() }

// WriteHeader keeps the status for the first body bytes or flush; an
// informational status goes at once, as net/http sends it.
func (c *clientWriter) WriteHeader(code int) {
	switch {
	case code < http.StatusOK:
		c.w.WriteHeader(code)
	case !c.committed && c.status == 0:
		c.status = code
	}
}

func (c *clientWriter) Write(p []byte) (int, error) {
	c.commit()
	return c.w.Write(p)
}

// FlushError sends the status and headers, and what was written.
func (c *clientWriter) FlushError() error {
	c.commit()
	return c.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection (its write
// deadline).
func (c *clientWriter) Unwrap() http.ResponseWriter { return c.w }

func (c *clientWriter) commit() {
	if c.committed {
		return
	}
	c.committed = true
	if c.status != 0 {
		c.w.WriteHeader(c.status)
	}
}

// reset readies the writer for another answer when the client has no
// byte of this one (its headers back to what they were before any
// attempt's) and reports whether it could.
func (c *clientWriter) reset() bool {
	if c.committed {
		return false
	}
	c.status = 0
	h := c.w.Header()
	clear(h)
	for k, v := range c.base {
		h[k] = append([]string(nil), v...)
	}
	return true
}
