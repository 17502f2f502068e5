package httpserve

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hang is the guard against a test that would otherwise wait forever; no
// test asserts anything about how fast the machine is.
const hang = 20 * time.Second

// serve starts a server for h on 127.0.0.1 and returns its address. The
// server's listener counts the connections it holds open.
func serve(t *testing.T, cfg Config, h http.Handler, tweak ...func(*Server)) (string, *Server) {
	addr, s, _ := serveCounted(t, cfg, h, tweak...)
	return addr, s
}

func serveCounted(t *testing.T, cfg Config, h http.Handler, tweak ...func(*Server)) (string, *Server, *countingListener) {
	t.Helper()
	s, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tweak {
		f(s)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return inner.Addr().String(), s, ln
}

// countingListener counts the open connections it accepted (file
// descriptors) and their peak.
type countingListener struct {
	net.Listener
	open, peak atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := l.open.Add(1)
	for p := l.peak.Load(); n > p && !l.peak.CompareAndSwap(p, n); p = l.peak.Load() {
	}
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, hang)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer waits (up to hang) for the server to end the connection
// and returns what it sent before.
func closedByServer(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(hang))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("server did not close the connection within %v (got %q)", hang, b)
	}
	return string(b)
}

func TestSlowBodyIsCut(t *testing.T) {
	cfg := Config{ReadTimeout: 200 * time.Millisecond}
	var got atomic.Value
	addr, _ := serve(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		got.Store(fmt.Sprint(err))
		w.WriteHeader(http.StatusRequestTimeout)
	}))
	c := dial(t, addr)
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	// The client never sends the other 90 bytes.
	resp := closedByServer(t, c)
	if !strings.Contains(resp, "408") {
		t.Errorf("response %q", resp)
	}
	if e, _ := got.Load().(string); !strings.Contains(e, "timeout") {
		t.Errorf("handler's read error %q, want a timeout", e)
	}
}

func TestIdleAndSilentConnectionsClosed(t *testing.T) {
	cfg := Config{IdleTimeout: 200 * time.Millisecond, ReadHeaderTimeout: 200 * time.Millisecond}
	addr, _ := serve(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))

	idle := dial(t, addr)
	fmt.Fprintf(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp := closedByServer(t, idle); !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Errorf("idle keep-alive: %q", resp)
	}
	silent := dial(t, addr)
	closedByServer(t, silent)
	slowHeaders := dial(t, addr)
	fmt.Fprintf(slowHeaders, "GET / HTTP/1.1\r\nHo")
	closedByServer(t, slowHeaders)
}

// TestConnectionLimit holds many keep-alive connections open against a
// server limited to 8: the server never has more than 8, idle ones are
// closed to make room, every client gets its answer and a normal request
// succeeds afterwards.
func TestConnectionLimit(t *testing.T) {
	const limit, clients = 8, 40
	cfg := Config{MaxConns: limit, IdleTimeout: time.Hour, ReadHeaderTimeout: time.Hour}
	addr, s, ln := serveCounted(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	var wg sync.WaitGroup
	answered := make(chan string, clients)
	for i := 0; i < clients; i++ {
		c := dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetDeadline(time.Now().Add(hang))
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answered <- err.Error()
				return
			}
			resp.Body.Close()
			answered <- resp.Status
			// Hold the connection: idle keep-alive until the server closes it.
		}()
	}
	wg.Wait()
	close(answered)
	for a := range answered {
		if a != "200 OK" {
			t.Errorf("client got %q", a)
		}
	}
	if p := ln.peak.Load(); p != limit {
		t.Errorf("server had %d connections open at once, want the limit %d", p, limit)
	}
	if n := s.ln.open(); n > limit {
		t.Errorf("%d connections counted, limit %d", n, limit)
	}
	client := &http.Client{Timeout: hang}
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("normal request after the storm: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("normal request: %s", resp.Status)
	}
}

// TestStreamOutlivesTimeouts streams for several read and write timeouts
// after a request body: the stream must not be cut and the request context
// must stay alive.
func TestStreamOutlivesTimeouts(t *testing.T) {
	cfg := Config{ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond}
	ctxErr := make(chan error, 1)
	addr, _ := serve(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 12; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			if err := rc.Flush(); err != nil {
				ctxErr <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		ctxErr <- r.Context().Err()
	}))
	client := &http.Client{Timeout: hang}
	resp, err := client.Post("http://"+addr+"/", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || strings.Count(string(b), "data:") != 12 {
		t.Errorf("stream cut: %v after %q", err, b)
	}
	if err := <-ctxErr; err != nil {
		t.Errorf("handler saw %v", err)
	}
}

func TestWriteTimeoutCutsNonReader(t *testing.T) {
	cfg := Config{WriteTimeout: 200 * time.Millisecond}
	werr := make(chan error, 1)
	addr, _ := serve(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		for i := 0; i < 4096; i++ { // 256 MiB: far more than socket buffers hold
			if _, err := w.Write(chunk); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}))
	c := dial(t, addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	// Never read.
	select {
	case err := <-werr:
		if err == nil {
			t.Error("256 MiB written to a client that does not read")
		}
	case <-time.After(hang):
		t.Fatal("write to a non-reading client never timed out")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []struct {
		c    Config
		flag string
	}{
		{Config{ReadTimeout: -1}, "--http-read-timeout"},
		{Config{IdleTimeout: 48 * time.Hour}, "--http-idle-timeout"},
		{Config{MaxConns: -5}, "--http-max-conns"},
		{Config{MaxBodyBytes: 1 << 50}, "--max-body-bytes"},
		{Config{MaxLargeBodies: 1 << 20}, "--http-max-large-bodies"},
		{Config{MaxHeaderBytes: -1}, "--http-max-header-bytes"},
	}
	for _, b := range bad {
		if _, err := New(b.c, http.NotFoundHandler()); err == nil || !strings.Contains(err.Error(), b.flag) {
			t.Errorf("%+v: %v, want an error naming %s", b.c, err, b.flag)
		}
	}
	if err := Defaults().Validate(); err != nil {
		t.Error(err)
	}
	if c := (Config{}).WithDefaults(); c != Defaults() {
		t.Errorf("zero config with defaults %+v", c)
	}
}
