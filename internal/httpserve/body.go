package httpserve

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// BodyLimiter reads request bodies under a size cap and bounds how many
// large ones are processed at once. Memory held by bodies is then at most
// (connections × LargeBodyBytes) + (MaxLargeBodies × MaxBodyBytes), times
// what a handler makes of a byte.
type BodyLimiter struct {
	max, large int64
	wait       time.Duration
	slots      chan struct{}
}

// NewBodyLimiter caps bodies at limit bytes; bodies above large bytes wait
// up to wait for one of n slots.
func NewBodyLimiter(limit, large int64, n int, wait time.Duration) *BodyLimiter {
	large = min(large, limit)
	return &BodyLimiter{max: limit, large: large, wait: wait, slots: make(chan struct{}, max(n, 1))}
}

// BodyLimiter is the limiter of c (defaults filled in): bodies up to
// MaxBodyBytes, or defaultMax when that is 0.
func (c Config) BodyLimiter(defaultMax int64) *BodyLimiter {
	c = c.WithDefaults()
	m := c.MaxBodyBytes
	if m == 0 {
		m = defaultMax
	}
	return NewBodyLimiter(m, c.LargeBodyBytes, c.MaxLargeBodies, c.LargeBodyWait)
}

// Max is the body cap in bytes.
func (l *BodyLimiter) Max() int64 { return l.max }

// InUse is the number of large bodies being processed.
func (l *BodyLimiter) InUse() int { return len(l.slots) }

// Read reads r's body. A body above the cap is a 413 (the connection is
// closed after the answer); a large body first waits for a slot (503 with
// Retry-After if none frees within the wait) and keeps it until release
// is called, which the caller does when it no longer needs what it made
// of the body. release is never nil and may be called more than once.
// Errors are *openai.Error.
func (l *BodyLimiter) Read(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error) {
	release = func() {}
	cl := r.ContentLength
	if cl > l.max {
		if cl-l.max > drainBytes {
			w.Header().Set("Connection", "close")
		} else {
			drain(r.Body)
		}
		return nil, release, openai.TooLarge(l.max)
	}
	rd := http.MaxBytesReader(w, r.Body, l.max)
	var buf []byte
	if cl > l.large {
		if release, err = l.acquire(r); err != nil {
			return nil, func() {}, err
		}
		buf = make([]byte, 0, cl)
	} else if cl >= 0 {
		buf = make([]byte, 0, cl)
	} else {
		// Unknown length: read what a small body may hold, then take a
		// slot for the rest.
		buf, err = readUpTo(rd, make([]byte, 0, 512), l.large+1)
		if err != nil || int64(len(buf)) <= l.large {
			return l.result(w, r, buf, release, err)
		}
		if release, err = l.acquire(r); err != nil {
			return nil, func() {}, err
		}
	}
	buf, err = readUpTo(rd, buf, l.max+1)
	return l.result(w, r, buf, release, err)
}

// drainBytes is how much of a body beyond the cap is read and dropped
// before answering 413, so that a client still sending it reads the
// answer instead of a connection reset. Larger bodies are cut.
const drainBytes = 1 << 20

// drain reads and drops up to drainBytes of body and reports whether it
// reached the end.
func drain(body io.Reader) bool {
	n, err := io.CopyN(io.Discard, body, drainBytes+1)
	return n <= drainBytes && err == io.EOF
}

func (l *BodyLimiter) result(w http.ResponseWriter, r *http.Request, buf []byte, release func(), err error) ([]byte, func(), error) {
	if err != nil {
		release()
		var mb *http.MaxBytesError
		if errors.As(err, &mb) && !drain(r.Body) {
			// net/http closes the connection after a MaxBytesReader
			// error only when it sees its own ResponseWriter; say it.
			w.Header().Set("Connection", "close")
		}
		return nil, func() {}, readError(err)
	}
	return buf, release, nil
}

// readUpTo appends from rd to buf until EOF or until buf holds limit
// bytes. A full buf is grown only when more data comes.
func readUpTo(rd io.Reader, buf []byte, limit int64) ([]byte, error) {
	for int64(len(buf)) < limit {
		var n int
		var err error
		if len(buf) == cap(buf) {
			var probe [512]byte
			n, err = rd.Read(probe[:min(int64(len(probe)), limit-int64(len(buf)))])
			buf = append(buf, probe[:n]...)
		} else {
			n, err = rd.Read(buf[len(buf):min(int64(cap(buf)), limit)])
			buf = buf[:len(buf)+n]
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

func readError(err error) error {
	var mb *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mb):
		return openai.TooLarge(mb.Limit)
	case errors.As(err, &ne) && ne.Timeout():
		return openai.Errorf(http.StatusRequestTimeout, "request body not received in time")
	}
	return openai.BadRequest("cannot read request body: %v", err)
}

func (l *BodyLimiter) acquire(r *http.Request) (func(), error) {
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-l.slots }) }, nil
	case <-r.Context().Done():
		return nil, openai.Unavailable(time.Second, "request cancelled while waiting for its turn: %v", r.Context().Err())
	case <-t.C:
		return nil, openai.Unavailable(time.Second, "too many large requests in progress (%d at once); retry later", cap(l.slots))
	}
}
