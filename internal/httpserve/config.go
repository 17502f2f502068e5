package httpserve

import (
	"errors"
	"time"

	"github.com/kvgate/kvgate/internal/flagrange"
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

// Limits are the ranges of a Config's numbers (0 always means "the
// default"); Validate enforces them and AddFlags registers them.
type Limits struct {
	Timeout     flagrange.Range[time.Duration]
	HeaderBytes flagrange.Range[int]
	Conns       flagrange.Range[int]
	BodyBytes   flagrange.Range[int64]
	LargeBodies flagrange.Range[int]
}

// ConfigLimits returns the ranges Validate enforces.
func ConfigLimits() Limits {
	return Limits{
		Timeout:     flagrange.Range[time.Duration]{Min: time.Millisecond, Max: 24 * time.Hour, Zero: "built-in"},
		HeaderBytes: flagrange.Range[int]{Min: 1024, Max: 16 << 20, Unit: "bytes", Zero: "built-in"},
		Conns:       flagrange.Range[int]{Min: 1, Max: 1 << 20, Unit: "connections", Zero: "built-in"},
		BodyBytes:   flagrange.Range[int64]{Min: 1, Max: 1 << 40, Unit: "bytes", Zero: "built-in"},
		LargeBodies: flagrange.Range[int]{Min: 1, Max: 1 << 16, Unit: "bodies", Zero: "built-in"},
	}
}

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
	l := ConfigLimits()
	return errors.Join(
		l.Timeout.Check("--http-read-header-timeout", c.ReadHeaderTimeout),
		l.Timeout.Check("--http-read-timeout", c.ReadTimeout),
		l.Timeout.Check("--http-write-timeout", c.WriteTimeout),
		l.Timeout.Check("--http-idle-timeout", c.IdleTimeout),
		l.Timeout.Check("--http-large-body-wait", c.LargeBodyWait),
		l.HeaderBytes.Check("--http-max-header-bytes", c.MaxHeaderBytes),
		l.Conns.Check("--http-max-conns", c.MaxConns),
		l.BodyBytes.Check("--max-body-bytes", c.MaxBodyBytes),
		l.BodyBytes.Check("--http-large-body-bytes", c.LargeBodyBytes),
		l.LargeBodies.Check("--http-max-large-bodies", c.MaxLargeBodies),
	)
}

// AddFlags defines the flags of c on fl, with c's values (zero fields
// filled from Defaults) as defaults, each with its range.
func AddFlags(fl *flagrange.Flags, c *Config) {
	AddFlagsBody(fl, c, ConfigLimits().BodyBytes)
}

// AddFlagsBody is AddFlags for a command whose --max-body-bytes has a
// narrower range of its own (kvgate serve's), so that its help shows it.
func AddFlagsBody(fl *flagrange.Flags, c *Config, body flagrange.Range[int64]) {
	*c = c.WithDefaults()
	l := ConfigLimits()
	flagrange.Var(fl, &c.ReadHeaderTimeout, "http-read-header-timeout", l.Timeout, "HTTP: time to read a request's headers (and how long a new connection may stay silent)")
	flagrange.Var(fl, &c.ReadTimeout, "http-read-timeout", l.Timeout, "HTTP: time to read a request body; slower bodies are cut")
	flagrange.Var(fl, &c.WriteTimeout, "http-write-timeout", l.Timeout, "HTTP: time a response write may block on a client that does not read (renewed on every write)")
	flagrange.Var(fl, &c.IdleTimeout, "http-idle-timeout", l.Timeout, "HTTP: close keep-alive connections idle this long")
	flagrange.Var(fl, &c.MaxHeaderBytes, "http-max-header-bytes", l.HeaderBytes, "HTTP: largest request header block")
	flagrange.Var(fl, &c.MaxConns, "http-max-conns", l.Conns, "HTTP: most open connections; more wait, and idle ones are closed to make room")
	flagrange.Var(fl, &c.MaxBodyBytes, "max-body-bytes", body, "largest request body, larger gets 413")
	flagrange.Var(fl, &c.LargeBodyBytes, "http-large-body-bytes", l.BodyBytes, "HTTP: bodies above this many bytes count against --http-max-large-bodies")
	flagrange.Var(fl, &c.MaxLargeBodies, "http-max-large-bodies", l.LargeBodies, "HTTP: large bodies read and processed at once (memory bound: this × --max-body-bytes)")
	flagrange.Var(fl, &c.LargeBodyWait, "http-large-body-wait", l.Timeout, "HTTP: how long a large body waits for its turn before 503")
}
