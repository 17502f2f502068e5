package kvevents

import (
	"testing"
)

// TestMapperParentZeroStartsChain: llm-d-inference-sim's positional form
// sends parent_block_hash 0 (not nil) for the first block of a chain. A
// parent 0 that was never stored starts a chain; one that was stored (an
// engine hash that happens to be 0) is a parent like any other.
func TestMapperParentZeroStartsChain(t *testing.T) {
	f := newFixture(t, 16)
	a := seqTokens(96, 21)
	f.apply(storedEvent(a[:48], 16, 100, u64(0)))
	f.apply(storedEvent(a[48:], 16, 103, u64(102)))
	if got := f.matched(a, nil); got != 6 || f.st.orphans.Load() != 0 {
		t.Fatalf("parent 0 never stored: matched %d blocks, %d orphans; want 6, 0", got, f.st.orphans.Load())
	}
	// An engine block whose hash is 0, then a child naming it.
	b := seqTokens(48, 22)
	f.apply(storedEvent(b[:16], 16, 0, nil))
	f.apply(storedEvent(b[16:], 16, 200, u64(0)))
	if got := f.matched(b, nil); got != 3 {
		t.Errorf("parent 0 stored: matched %d blocks, want 3", got)
	}
	// An unknown non-zero parent is still an orphan.
	f.apply(storedEvent(seqTokens(32, 23), 16, 300, u64(999)))
	if f.st.orphans.Load() != 2 {
		t.Errorf("orphans %d, want 2", f.st.orphans.Load())
	}
}
