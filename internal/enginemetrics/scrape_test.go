package enginemetrics

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
)

func TestScrape(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm_dp2.txt")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Accept"); !strings.HasPrefix(got, "text/plain") {
			t.Errorf("Accept %q", got)
		}
		w.Write(vllm)
	})
	mux.HandleFunc("/gz/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write(vllm)
		zw.Close()
	})
	mux.HandleFunc("/fail/metrics", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	mux.HandleFunc("/big/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Write(bytes.Repeat([]byte("# padding padding padding\n"), 200))
		w.Write(vllm)
	})
	mux.HandleFunc("/hang/metrics", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	s := &Scraper{Now: func() time.Time { return t0 }}
	ctx := context.Background()
	for _, base := range []string{srv.URL, srv.URL + "/gz"} {
		m, err := s.Scrape(ctx, base, "Qwen/Qwen3-8B")
		if err != nil || m.Time != t0 || m.Waiting != 13 || m.NumGPUBlocks != 55816 {
			t.Errorf("%s: %+v %v", base, m, err)
		}
	}
	if _, err := s.Scrape(ctx, srv.URL+"/fail", ""); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("5xx: %v", err)
	}
	small := &Scraper{MaxBytes: int64(len(vllm)) + 100}
	if _, err := small.Scrape(ctx, srv.URL+"/big", ""); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("size cap: %v", err)
	}
	if _, err := small.Scrape(ctx, srv.URL, ""); err != nil {
		t.Errorf("within the cap: %v", err)
	}
	quick := &Scraper{Timeout: 50 * time.Millisecond}
	if _, err := quick.Scrape(ctx, srv.URL+"/hang", ""); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("timeout: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Scrape(cctx, srv.URL, ""); err == nil {
		t.Error("cancelled context: no error")
	}
	if _, err := s.Scrape(ctx, "http://127.0.0.1:1", ""); err == nil {
		t.Error("refused connection: no error")
	}
	if _, err := s.Scrape(ctx, "::bad", ""); err == nil {
		t.Error("bad URL: no error")
	}
}

// TestScrapeEmulator reads a live in-process `kvgate engine`.
func TestScrapeEmulator(t *testing.T) {
	e := enginetest.Start(t, 100, func(c *engine.Config) {
		c.Model, c.Host = "emu", "127.0.0.1"
		c.BlockSize, c.NumGPUBlocks = 32, 512
	})
	m, err := (&Scraper{}).Scrape(context.Background(), "http://"+e.Addr(), "emu")
	if err != nil {
		t.Fatal(err)
	}
	if m.Flavor != FlavorVLLM || !m.Has(vllmAll) || m.BlockSize != 32 || m.NumGPUBlocks != 512 || m.Time.IsZero() {
		t.Fatalf("%+v", m)
	}
}
