package httpserve

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Config is the protection of one HTTP server. Zero fields take the
// defaults of Defaults (see WithDefaults); negative ones are invalid.
type Config struct {
	// ReadHeaderTimeout bounds reading a request's headers, and how long a
	// new connection may stay silent.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a request's body, from the handler's
	// start; a slower body is cut. Once the body is read the deadline is
	// lifted, so long responses (SSE) are not affected.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds each write of a response: a client that stops
	// reading for this long is cut. It is renewed on every write, so a
	// stream may last as long as it keeps moving.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes keep-alive connections idle this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes bounds request headers.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxConns bounds open connections. Beyond it new connections wait in
	// the kernel's accept queue (no file descriptor is used) while idle
	// keep-alive and silent connections are closed to make room.
	MaxConns int `yaml:"max_conns"`
	// MaxBodyBytes bounds request bodies: larger ones get 413. Zero means
	// the server's own default (the engine derives one from its model
	// length).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// LargeBodyBytes: a body above it takes one of MaxLargeBodies slots
	// while it is read and processed; small bodies need none.
	LargeBodyBytes int64 `yaml:"large_body_bytes"`
	// MaxLargeBodies bounds large bodies processed at once, so they hold
	// at most MaxLargeBodies × MaxBodyBytes of memory.
	MaxLargeBodies int `yaml:"max_large_bodies"`
	// LargeBodyWait is how long a large body waits for a slot before the
	// request gets 503 with Retry-After.
	LargeBodyWait time.Duration `yaml:"large_body_wait"`
}

// Defaults are the settings every kvgate HTTP server starts from.
func Defaults() Config {
	return Config{
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		MaxConns:          512,
		LargeBodyBytes:    256 << 10,
		MaxLargeBodies:    4,
		LargeBodyWait:     10 * time.Second,
	}
}

// Ranges accepted by Validate.
const (
	maxTimeout      = 24 * time.Hour
	maxHeaderLimit  = 16 << 20
	maxConnsLimit   = 1 << 20
	maxBodyLimit    = 1 << 40
	maxLargeBodiesN = 1 << 16
)

// WithDefaults returns c with its zero fields set from Defaults.
func (c Config) WithDefaults() Config {
	d := Defaults()
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.ReadHeaderTimeout, d.ReadHeaderTimeout)
	setDur(&c.ReadTimeout, d.ReadTimeout)
	setDur(&c.WriteTimeout, d.WriteTimeout)
	setDur(&c.IdleTimeout, d.IdleTimeout)
	setDur(&c.LargeBodyWait, d.LargeBodyWait)
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	if c.LargeBodyBytes == 0 {
		c.LargeBodyBytes = d.LargeBodyBytes
	}
	if c.MaxLargeBodies == 0 {
		c.MaxLargeBodies = d.MaxLargeBodies
	}
	return c
}

// Validate reports values out of range, naming the flag of each.
func (c Config) Validate() error {
	var errs []error
	dur := func(flag string, v time.Duration) {
		if v < 0 || v > maxTimeout {
			errs = append(errs, fmt.Errorf("--%s must be in [0, %v] (0: default), got %v", flag, maxTimeout, v))
		}
	}
	num := func(flag string, v, hi int64) {
		if v < 0 || v > hi {
			errs = append(errs, fmt.Errorf("--%s must be in [0, %d] (0: default), got %d", flag, hi, v))
		}
	}
	dur("http-read-header-timeout", c.ReadHeaderTimeout)
	dur("http-read-timeout", c.ReadTimeout)
	dur("http-write-timeout", c.WriteTimeout)
	dur("http-idle-timeout", c.IdleTimeout)
	dur("http-large-body-wait", c.LargeBodyWait)
	num("http-max-header-bytes", int64(c.MaxHeaderBytes), maxHeaderLimit)
	num("http-max-conns", int64(c.MaxConns), maxConnsLimit)
	num("max-body-bytes", c.MaxBodyBytes, maxBodyLimit)
	num("http-large-body-bytes", c.LargeBodyBytes, maxBodyLimit)
	num("http-max-large-bodies", int64(c.MaxLargeBodies), maxLargeBodiesN)
	return errors.Join(errs...)
}

// AddFlags defines the flags of c on fs, with c's values (zero fields
// filled from Defaults) as defaults.
func AddFlags(fs *flag.FlagSet, c *Config) {
	*c = c.WithDefaults()
	fs.DurationVar(&c.ReadHeaderTimeout, "http-read-header-timeout", c.ReadHeaderTimeout, "HTTP: time to read a request's headers (and how long a new connection may stay silent)")
	fs.DurationVar(&c.ReadTimeout, "http-read-timeout", c.ReadTimeout, "HTTP: time to read a request body; slower bodies are cut")
	fs.DurationVar(&c.WriteTimeout, "http-write-timeout", c.WriteTimeout, "HTTP: time a response write may block on a client that does not read (renewed on every write)")
	fs.DurationVar(&c.IdleTimeout, "http-idle-timeout", c.IdleTimeout, "HTTP: close keep-alive connections idle this long")
	fs.IntVar(&c.MaxHeaderBytes, "http-max-header-bytes", c.MaxHeaderBytes, "HTTP: largest request header block")
	fs.IntVar(&c.MaxConns, "http-max-conns", c.MaxConns, "HTTP: most open connections; more wait, and idle ones are closed to make room")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest request body in bytes, larger gets 413 (0: the server's default, see docs)")
	fs.Int64Var(&c.LargeBodyBytes, "http-large-body-bytes", c.LargeBodyBytes, "HTTP: bodies above this many bytes count against --http-max-large-bodies")
	fs.IntVar(&c.MaxLargeBodies, "http-max-large-bodies", c.MaxLargeBodies, "HTTP: large bodies read and processed at once (memory bound: this × --max-body-bytes)")
	fs.DurationVar(&c.LargeBodyWait, "http-large-body-wait", c.LargeBodyWait, "HTTP: how long a large body waits for its turn before 503")
}
