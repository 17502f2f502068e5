package discovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/discovery/discoverytest"
	"github.com/kvgate/kvgate/internal/fleet"
)

func next(t *testing.T, updates <-chan []fleet.Endpoint) []fleet.Endpoint {
	t.Helper()
	return discoverytest.Next(t, updates)
}

func names(eps []fleet.Endpoint) string {
	var n []string
	for _, e := range eps {
		n = append(n, e.Name)
	}
	return strings.Join(n, ",")
}

func wantNames(t *testing.T, updates <-chan []fleet.Endpoint, want string) []fleet.Endpoint {
	t.Helper()
	eps := next(t, updates)
	if got := names(eps); got != want {
		t.Fatalf("update %q, want %q", got, want)
	}
	return eps
}

func endpointsYAML(names ...string) string {
	var b strings.Builder
	b.WriteString("endpoints:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  - {name: %s, url: \"http://127.0.0.1:9/%s\", model: m, role: both}\n", n, n)
	}
	return b.String()
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStatic(t *testing.T) {
	if _, err := NewStatic([]fleet.Endpoint{{Name: "a", Model: "m"}, {Name: "a", Model: "m"}}); err == nil {
		t.Fatal("duplicate names accepted")
	}
	src, err := NewStatic([]fleet.Endpoint{{URL: "http://h:1/", Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	updates := discoverytest.Run(t, src)
	eps := wantNames(t, updates, "h:1")
	if eps[0].URL != "http://h:1" {
		t.Fatalf("not normalised: %+v", eps[0])
	}
	eps[0].Name = "mutated" // the callee owns its copy
	discoverytest.NoUpdate(t, updates)
}

func TestNotifier(t *testing.T) {
	var got [][]fleet.Endpoint
	sink := &discoverytest.LogSink{}
	n := NewNotifier("test", sink.Logger(), func(eps []fleet.Endpoint) { got = append(got, eps) })
	a, b := fleet.Endpoint{Name: "a", Model: "m"}, fleet.Endpoint{Name: "b", Model: "m"}
	b2 := b
	b2.Role = fleet.RoleDecode
	steps := []struct {
		eps  []fleet.Endpoint
		sent bool
	}{
		{nil, true}, // the first list is always sent, even empty
		{nil, false},
		{[]fleet.Endpoint{a, b}, true},
		{[]fleet.Endpoint{a, b}, false},
		{[]fleet.Endpoint{a, b2}, true},
		{[]fleet.Endpoint{b2}, true},
	}
	for i, s := range steps {
		if sent := n.Publish(s.eps); sent != s.sent {
			t.Fatalf("step %d: sent %v, want %v", i, sent, s.sent)
		}
	}
	if len(got) != 4 {
		t.Fatalf("%d updates", len(got))
	}
	if sink.Count("changed=[b]") != 1 || sink.Count("removed=[a]") != 1 {
		t.Fatalf("logs:\n%s", sink.String())
	}
	added, removed, changed := Diff([]fleet.Endpoint{a, b}, []fleet.Endpoint{b2, {Name: "c", Model: "m"}})
	if !slices.Equal(added, []string{"c"}) || !slices.Equal(removed, []string{"a"}) || !slices.Equal(changed, []string{"b"}) {
		t.Fatal(added, removed, changed)
	}
}

func newFileSource(t *testing.T, path string, sink *discoverytest.LogSink) *File {
	t.Helper()
	f, err := NewFile(FileConfig{Path: path, Debounce: 20 * time.Millisecond, Logger: sink.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFileChanges(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	writeFile(t, path, endpointsYAML("a", "b"))
	sink := &discoverytest.LogSink{}
	updates := discoverytest.Run(t, newFileSource(t, path, sink))
	wantNames(t, updates, "a,b")

	// Add, then remove, by rewriting in place.
	writeFile(t, path, endpointsYAML("a", "b", "c"))
	wantNames(t, updates, "a,b,c")
	writeFile(t, path, endpointsYAML("a", "c"))
	wantNames(t, updates, "a,c")

	// A bad write keeps the list and is logged with its error.
	writeFile(t, path, "endpoints:\n  - {name: x, model: m, colour: red}\n")
	sink.Wait(t, "colour", 1)
	discoverytest.NoUpdate(t, updates)
	writeFile(t, path, endpointsYAML("a", "a"))
	sink.Wait(t, "already used", 1)
	writeFile(t, path, "")
	sink.Wait(t, "empty file", 1)
	discoverytest.NoUpdate(t, updates)
	// A write cut after "endpoints:", or only a comment, is no list
	// either (it emptied the fleet until 2026-12-04).
	writeFile(t, path, "endpoints:\n")
	sink.Wait(t, "no endpoints: list", 1)
	writeFile(t, path, "# fleet drained\n") // the same error: not logged again
	discoverytest.NoUpdate(t, updates)
	// The old content again: nothing changed for the consumer.
	writeFile(t, path, endpointsYAML("a", "c"))
	writeFile(t, path, endpointsYAML("c"))
	wantNames(t, updates, "c")

	// Atomic replace, as editors and config tools do it.
	tmp := filepath.Join(dir, ".endpoints.yaml.tmp")
	writeFile(t, tmp, endpointsYAML("c", "d"))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	wantNames(t, updates, "c,d")

	// Deleted: the last list stays, and the deletion is logged; created
	// again: read again.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	sink.Wait(t, "endpoint file is missing", 1)
	discoverytest.NoUpdate(t, updates)
	writeFile(t, path, endpointsYAML("e"))
	wantNames(t, updates, "e")
	// "endpoints: []" is a real empty list.
	writeFile(t, path, "endpoints: []\n")
	wantNames(t, updates, "")
}

// TestFileConfigMapSwap replays how kubelet updates a mounted ConfigMap:
// the file is a symlink through ..data, which is swapped atomically to a
// new timestamped directory.
func TestFileConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mk := func(ts string, eps ...string) {
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, ts, "endpoints.yaml"), endpointsYAML(eps...))
	}
	swap := func(ts, old string) {
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(ts, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	mk("..2026_01_01_00_00_00.1", "a")
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "endpoints.yaml")
	if err := os.Symlink("..data/endpoints.yaml", path); err != nil {
		t.Fatal(err)
	}
	sink := &discoverytest.LogSink{}
	updates := discoverytest.Run(t, newFileSource(t, path, sink))
	wantNames(t, updates, "a")
	mk("..2026_01_01_00_01_00.2", "a", "b")
	swap("..2026_01_01_00_01_00.2", "..2026_01_01_00_00_00.1")
	wantNames(t, updates, "a,b")
	mk("..2026_01_01_00_02_00.3", "b")
	swap("..2026_01_01_00_02_00.3", "..2026_01_01_00_01_00.2")
	wantNames(t, updates, "b")
}

// TestFileSymlinkElsewhere: the path links into another directory, where
// the file is rewritten in place.
func TestFileSymlinkElsewhere(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real.yaml")
	writeFile(t, real, endpointsYAML("a"))
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.Symlink(real, path); err != nil {
		t.Fatal(err)
	}
	updates := discoverytest.Run(t, newFileSource(t, path, &discoverytest.LogSink{}))
	wantNames(t, updates, "a")
	writeFile(t, real, endpointsYAML("a", "b"))
	wantNames(t, updates, "a,b")
}

func TestFileStartErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "endpoints: 3\n")
	for path, want := range map[string]string{
		filepath.Join(dir, "missing.yaml"):      "no such file",
		bad:                                     "where a list belongs",
		filepath.Join(dir, "nodir", "eps.yaml"): "no such file",
	} {
		f := newFileSource(t, path, &discoverytest.LogSink{})
		err := f.Run(context.Background(), func([]fleet.Endpoint) { t.Error("update from a bad start") })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", path, err, want)
		}
	}
	for _, cfg := range []FileConfig{{}, {Path: "x", Debounce: -1}, {Path: "x", Debounce: time.Hour}} {
		if _, err := NewFile(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, "# "+strings.Repeat("x", MaxFileBytes)+"\n")
	if _, _, err := LoadFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
	// A FIFO is refused at once: opened, it blocked until a writer came,
	// and froze discovery for good (walkthrough, 2026-12-04).
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("no FIFO here:", err)
	}
	done := make(chan error, 1)
	go func() { _, _, err := LoadFile(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("a FIFO: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LoadFile blocked on a FIFO")
	}
}

// TestFileChangesBesideNoise: writes to another file in the directory do
// not hold a change of the endpoint file back (a log written every 20 ms
// beside it delayed a change by 39 s: walkthrough, 2026-12-04).
func TestFileChangesBesideNoise(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	writeFile(t, path, endpointsYAML("a"))
	updates := discoverytest.Run(t, newFileSource(t, path, &discoverytest.LogSink{}))
	wantNames(t, updates, "a")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		noise := filepath.Join(dir, "noise.log")
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				f, err := os.OpenFile(noise, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
				if err == nil {
					f.WriteString("x\n")
					f.Close()
				}
			}
		}
	}()
	writeFile(t, path, endpointsYAML("a", "b"))
	wantNames(t, updates, "a,b")
}

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}

// TestFileDirectoryReplaced: the endpoint file's directory removed and
// made again, or a release symlink swapped to another directory, is
// watched again: one change was applied, then every later one was lost
// (walkthrough, 2026-12-04).
func TestFileDirectoryReplaced(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(sub, "endpoints.yaml")
	writeFile(t, path, endpointsYAML("a"))
	updates := discoverytest.Run(t, newFileSource(t, path, &discoverytest.LogSink{}))
	wantNames(t, updates, "a")
	if err := os.RemoveAll(sub); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, endpointsYAML("b"))
	wantNames(t, updates, "b")
	writeFile(t, path, endpointsYAML("b", "c")) // an edit after: was lost
	wantNames(t, updates, "b,c")

	// current -> rel1, swapped to rel2 as a release tool does.
	for _, rel := range []string{"rel1", "rel2"} {
		if err := os.Mkdir(filepath.Join(root, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(root, "rel1", "eps.yaml"), endpointsYAML("r1"))
	writeFile(t, filepath.Join(root, "rel2", "eps.yaml"), endpointsYAML("r2"))
	current := filepath.Join(root, "current")
	if err := os.Symlink("rel1", current); err != nil {
		t.Fatal(err)
	}
	updates2 := discoverytest.Run(t, newFileSource(t, filepath.Join(current, "eps.yaml"), &discoverytest.LogSink{}))
	wantNames(t, updates2, "r1")
	tmp := filepath.Join(root, "current.tmp")
	if err := os.Symlink("rel2", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, current); err != nil {
		t.Fatal(err)
	}
	wantNames(t, updates2, "r2")
	writeFile(t, filepath.Join(root, "rel2", "eps.yaml"), endpointsYAML("r2", "r3"))
	wantNames(t, updates2, "r2,r3")
}
