//go:build attack && linux

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
	"github.com/kvgate/kvgate/internal/httpserve"
)

// memBounds are an attack run's stated memory bounds, checked for every
// phase: the peak resident memory of the whole process (attackers
// included) during the phase, and how much the heap in use after a GC may
// have grown across the phase (memory kept after the attack).
type memBounds struct {
	PeakRSS    int64
	HeapGrowth int64
}

// attackPhase is one attack; check runs after it (and its memory
// readings): the targets survived and serve a normal request.
type attackPhase struct {
	name string
	run  func(t *testing.T)
	// peakRSS, when set, replaces the run's peak RSS bound for this
	// phase (one whose legitimate work needs more, stated beside it).
	peakRSS int64
}

// runAttackPhases runs each phase as a subtest between memory readings and
// then check. VmHWM is reset before each phase (clear_refs 5), so the peak
// is the phase's own.
func runAttackPhases(t *testing.T, phases []attackPhase, b memBounds, check func(t *testing.T, when string)) {
	var rows []string
	for _, p := range phases {
		t.Run(p.name, func(t *testing.T) {
			heap0 := heapAfterGC()
			resetPeakRSS(t)
			p.run(t)
			peak := procStatus(t, "VmHWM")
			heap1 := heapAfterGC()
			rss := procStatus(t, "VmRSS")
			row := strings.Join([]string{p.name, mib(peak), mib(heap0), mib(heap1), mib(rss)}, " | ")
			rows = append(rows, row)
			bound := b.PeakRSS
			if p.peakRSS > 0 {
				bound = p.peakRSS
			}
			t.Logf("memory: peak RSS %s (bound %s); heap in use after GC %s before, %s after (growth bound %s); RSS after GC %s",
				mib(peak), mib(bound), mib(heap0), mib(heap1), mib(b.HeapGrowth), mib(rss))
			if peak > bound {
				t.Errorf("peak RSS %s above the bound of %s", mib(peak), mib(bound))
			}
			if heap1-heap0 > b.HeapGrowth {
				t.Errorf("heap in use grew by %s across the phase, bound %s", mib(heap1-heap0), mib(b.HeapGrowth))
			}
			check(t, "after "+p.name)
		})
	}
	t.Logf("phase | peak RSS | heap before | heap after | RSS after\n%s", strings.Join(rows, "\n"))
	resetPeakRSS(t) // the next test's peak is its own
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// heapAfterGC is the heap in use after a full GC, with freed memory
// returned to the system (so VmRSS then shows what is kept).
func heapAfterGC() int64 {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// resetPeakRSS makes VmHWM start again from the current RSS.
func resetPeakRSS(t *testing.T) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset the peak RSS: %v", err)
	}
}

// raiseFDLimit lifts RLIMIT_NOFILE's soft limit to at least n (within the
// hard limit) for the test.
func raiseFDLimit(t *testing.T, n uint64) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if old.Cur >= n {
		return
	}
	if old.Max < n {
		t.Fatalf("RLIMIT_NOFILE hard limit %d; these attacks need %d descriptors (scripts/attack.sh raises it)", old.Max, n)
	}
	lim := old
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// smallRecvDialer dials with a 4 KiB receive buffer, so a peer that never
// reads stalls its sender after little data.
var smallRecvDialer = net.Dialer{
	Timeout: attackHang,
	Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	},
}

// waitUntil polls f every 10 ms until it holds; after attackHang it fails
// the test (a hang guard, never a speed assertion).
func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(attackHang)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", attackHang, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startEventsEngine starts an engine emulator on 127.0.0.1, 100 times
// faster than real time, with KV events (PUB and replay ROUTER) on
// ephemeral ports; it stops when the test ends.
func startEventsEngine(t *testing.T) *engine.Engine {
	t.Helper()
	return enginetest.Start(t, 100, func(c *engine.Config) {
		c.Model = model
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
	})
}

// serveHTTP serves h with httpserve's protection cfg on an ephemeral
// 127.0.0.1 port until the test ends and returns its host:port.
func serveHTTP(t *testing.T, cfg httpserve.Config, h http.Handler) string {
	t.Helper()
	srv, err := httpserve.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// slowClients opens n connections to addr at once; each writes what start
// writes (the beginning of a request) and then stalls. It reports how many
// the server had not closed after attackHang.
func slowClients(t *testing.T, addr string, n int, start func(c net.Conn, i int)) int {
	t.Helper()
	var wg sync.WaitGroup
	var held atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", addr, attackHang)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer c.Close()
			start(c, i)
			_ = c.SetReadDeadline(time.Now().Add(attackHang))
			if _, err := io.Copy(io.Discard, c); isTimeout(err) {
				held.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(held.Load())
}

// idleStorm opens n connections to addr, sends each a keep-alive GET of
// path and leaves it idle once answered (open until the test ends). It
// returns how many were not answered 200 and by how many the process's
// descriptors grew at most meanwhile.
func idleStorm(t *testing.T, addr, path string, n int) (failed, fdGrowth int) {
	t.Helper()
	base := openFDs(t)
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, attackHang)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	var wg sync.WaitGroup
	var nFailed atomic.Int64
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetDeadline(time.Now().Add(attackHang))
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				if nFailed.Add(1) <= 3 {
					t.Errorf("storm client %d: %v", i, err)
				}
				return
			}
			resp.Body.Close()
			_ = c.SetDeadline(time.Time{}) // now idle
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(50 * time.Millisecond):
		}
		fdGrowth = max(fdGrowth, openFDs(t)-base)
	}
	return int(nFailed.Load()), fdGrowth
}
