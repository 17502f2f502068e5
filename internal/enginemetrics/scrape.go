package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Scraper defaults.
const (
	DefaultMaxBytes = 4 << 20
	DefaultTimeout  = 5 * time.Second
	DefaultPath     = "/metrics"
)

// Scraper fetches and parses engines' /metrics. The zero value is usable;
// one Scraper may serve many engines concurrently.
type Scraper struct {
	// Client makes the requests; nil: a client without a timeout of its
	// own (Timeout applies).
	Client *http.Client
	// MaxBytes caps the (decompressed) body read; a larger exposition is
	// an error. 0: DefaultMaxBytes.
	MaxBytes int64
	// Timeout bounds one scrape on top of the caller's context. 0:
	// DefaultTimeout.
	Timeout time.Duration
	// Path is appended to the engine's base URL. "": DefaultPath.
	Path string
	// Now stamps the result; nil: time.Now.
	Now func() time.Time
}

// Scrape GETs baseURL+Path and parses it (see Parse; model filters by the
// model_name label, "" keeps every model). The result's Time is when the
// body was read.
func (s *Scraper) Scrape(ctx context.Context, baseURL, model string) (Metrics, error) {
	return s.ScrapeRank(ctx, baseURL, model, -1)
}

// ScrapeRank is Scrape for one data-parallel rank (ParseRank; negative:
// every rank).
func (s *Scraper) ScrapeRank(ctx context.Context, baseURL, model string, rank int) (Metrics, error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	path := s.Path
	if path == "" {
		path = DefaultPath
	}
	url := baseURL + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	// The classic text format: never protobuf or OpenMetrics.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	client := s.Client
	if client == nil {
		client = &http.Client{}
	}
	resp, err := client.Do(req)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, fmt.Errorf("scrape %s: status %s", url, resp.Status)
	}
	limit := s.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxBytes
	}
	lr := &limitedReader{r: resp.Body, left: limit}
	m, err := ParseRank(lr, model, rank)
	if lr.over {
		return Metrics{}, fmt.Errorf("scrape %s: body larger than %d bytes", url, limit)
	}
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	m.Time = now()
	return m, nil
}

// errTooLarge stops the parser when the body passes the cap.
var errTooLarge = errors.New("body too large")

// limitedReader fails (rather than ending quietly, as io.LimitReader
// does) once more than left bytes are read, so a truncated exposition is
// never mistaken for a whole one.
type limitedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.over {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		l.over = true
		return 0, errTooLarge
	}
	return n, err
}
