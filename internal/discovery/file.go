package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/internal/fleet"
)

// File defaults and limits.
const (
	DefaultDebounce = 100 * time.Millisecond
	MaxDebounce     = time.Minute
	MaxFileBytes    = 8 << 20
)

// FileConfig configures a File source.
type FileConfig struct {
	// Path is the YAML file of endpoints (fleet.ParseFile's format).
	Path string
	// Debounce waits for this much quiet after a change before reading
	// the file (editors and kubelet write in several steps), in
	// [1ms, 1m]; 0: DefaultDebounce.
	Debounce time.Duration
	// Logger; nil: slog.Default().
	Logger *slog.Logger
}

// File is a YAML file of endpoints, watched for changes. It watches the
// file's directory rather than the file, so that an editor's
// write-and-rename, a Kubernetes ConfigMap's symlink swap (..data) or a
// file deleted and created again are all seen; when the path is a symlink
// into another directory, that directory is watched too. After each change
// (debounced) the file is read again: a list that fails to parse or
// validate, an empty file, or a missing file keeps the previous list and
// is logged, never applied.
type File struct {
	path     string
	debounce time.Duration
	log      *slog.Logger
}

// NewFile checks cfg.
func NewFile(cfg FileConfig) (*File, error) {
	if cfg.Path == "" {
		return nil, errors.New("discovery: file path is required")
	}
	abs, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("discovery: file %q: %w", cfg.Path, err)
	}
	d := cfg.Debounce
	if d == 0 {
		d = DefaultDebounce
	}
	if d < time.Millisecond || d > MaxDebounce {
		return nil, fmt.Errorf("discovery: debounce %v out of range [1ms, %v]", d, MaxDebounce)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &File{path: abs, debounce: d, log: log.With("file", abs)}, nil
}

// LoadFile reads and validates a file of endpoints. An empty file is an
// error (a half-written file reads as empty); a file saying
// "endpoints: []" is an empty list.
func LoadFile(path string) ([]fleet.Endpoint, []byte, error) {
	// A regular file (through links) before it is opened: opening a FIFO
	// blocks until a writer comes, which froze discovery for good.
	if st, err := os.Stat(path); err != nil {
		return nil, nil, err
	} else if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: not a regular file (%v)", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, data, fmt.Errorf("%s: empty file (write endpoints: [] for no endpoints)", path)
	}
	eps, err := fleet.ParseFile(data)
	if err != nil {
		return nil, data, fmt.Errorf("%s: %w", path, err)
	}
	// "endpoints:" with nothing after it, or only comments, is as likely
	// a write cut short as an empty one (it emptied the fleet until
	// 2026-12-04); no endpoints is said with endpoints: [].
	var probe struct {
		Endpoints *[]yaml.Node `yaml:"endpoints"`
	}
	if yaml.Unmarshal(data, &probe) == nil && probe.Endpoints == nil {
		return nil, data, fmt.Errorf("%s: no endpoints: list (write endpoints: [] for no endpoints)", path)
	}
	return eps, data, nil
}

// Run watches the file until ctx ends. The file must be valid at start.
func (f *File) Run(ctx context.Context, update func([]fleet.Endpoint)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("discovery: watch %s: %w", f.path, err)
	}
	defer w.Close()
	dir := filepath.Dir(f.path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("discovery: watch %s: %w", dir, err)
	}
	// Its parent too, so that a directory replaced (removed and made
	// again, or a release symlink swapped to another) is watched again:
	// the watch stayed on the old one, and every change after was lost.
	if parent := filepath.Dir(dir); parent != dir {
		if err := w.Add(parent); err != nil {
			f.log.Warn("discovery: cannot watch the endpoint file's parent directory; a replaced directory will not be followed", "dir", parent, "err", err)
		}
	}
	// Watch first, then read: a change in between is not lost.
	wt := watchTarget{w: w, dir: dir, log: f.log}
	wt.follow(f.path)
	eps, last, err := LoadFile(f.path)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	n := NewNotifier("file", f.log, update)
	n.Publish(eps)

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// The file is read debounce after the last change, but no later than
	// maxWait after the first unread one: a log written every 20 ms beside
	// it held a change back as long as it ran (39 s in a walkthrough).
	var pending time.Time
	arm := func() {
		if pending.IsZero() {
			pending = time.Now()
		}
		timer.Reset(min(f.debounce, max(f.maxWait()-time.Since(pending), 0)))
	}
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("discovery: watcher of %s closed", dir)
			}
			switch {
			case ev.Name == dir && ev.Has(fsnotify.Remove|fsnotify.Rename):
				f.log.Warn("discovery: the endpoint file's directory is gone; keeping the last list until it is back", "dir", dir)
			case ev.Name == dir && ev.Has(fsnotify.Create):
				// Made again, or a symlink swapped to another directory:
				// watch what it is now.
				_ = w.Remove(dir)
				if err := w.Add(dir); err != nil {
					f.log.Warn("discovery: cannot watch the endpoint file's directory again", "dir", dir, "err", err)
				}
			}
			if wt.relevant(ev.Name, f.path) {
				arm()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("discovery: watcher of %s closed", dir)
			}
			// An overflow may have hidden a change: read again.
			f.log.Warn("discovery: watch error; reading the file again", "err", err)
			arm()
		case <-timer.C:
			pending = time.Time{}
			wt.follow(f.path)
			eps, data, err := LoadFile(f.path)
			switch {
			case err != nil:
				if msg := err.Error(); msg != lastErr {
					lastErr = msg
					if errors.Is(err, fs.ErrNotExist) {
						f.log.Warn("discovery: endpoint file is missing; keeping the last list", "err", err)
					} else {
						f.log.Error("discovery: bad endpoint file; keeping the last list", "err", err)
					}
				}
				last = nil // the same bytes written again are read again
			case bytes.Equal(data, last):
			default:
				lastErr, last = "", data
				n.Publish(eps)
			}
		}
	}
}

// maxWait bounds how long changes keep coming before the file is read
// anyway: 10 debounces.
func (f *File) maxWait() time.Duration { return 10 * f.debounce }

// relevant reports whether an event on name may change the file at path:
// the file itself, the file it links to, the directory, or a name of a
// Kubernetes ConfigMap mount's swap (..data, ..2026_12_04…); another
// file's in the directory is not (a log beside it held changes back).
func (t *watchTarget) relevant(name, path string) bool {
	base := filepath.Base(name)
	return name == t.dir || name == t.extra || base == filepath.Base(path) || base == t.realBase || strings.HasPrefix(base, "..")
}

// watchTarget also watches the directory a symlinked file really lives
// in, when that is not the directory of its path.
type watchTarget struct {
	w     *fsnotify.Watcher
	dir   string
	extra string
	// realBase is the name of the file the path links to, as last
	// followed (relevant reads it: resolving the link at each event cost
	// a lookup for every write of every file beside it).
	realBase string
	log      *slog.Logger
}

func (t *watchTarget) follow(path string) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return
	}
	t.realBase = filepath.Base(real)
	rdir := filepath.Dir(real)
	if rdir == t.dir || rdir == t.extra {
		return
	}
	if t.extra != "" {
		t.w.Remove(t.extra) // gone already when a ConfigMap swap removed it
	}
	t.extra = ""
	if err := t.w.Add(rdir); err != nil {
		t.log.Warn("discovery: cannot watch the directory the endpoint file links to", "dir", rdir, "err", err)
		return
	}
	t.extra = rdir
}
