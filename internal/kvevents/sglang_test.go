package kvevents

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/tokens"
)

// sglangTree is a model of what SGLang's radix cache publishes
// (python/sglang/srt/mem_cache: KVCacheEventMixin, read 2026-12-02): one
// BlockStored per page of a node, its hash chained from the node's parent
// (compute_node_hash_values, then hash_str_to_int64: a signed int64, often
// negative), parent_block_hash the parent node's last page (None under the
// root), lora_id None and medium "GPU"; a node split publishes the old
// node's pages removed, then the two halves stored; an evicted leaf its
// pages removed. Batches are [ts, events]: SGLang's EventBatch has no
// data_parallel_rank. Only whole pages are cached (page-aligned keys), as
// SGLang does for a page size above 1.
type sglangTree struct {
	page int
	w    *mpw
	n    int // events in w
}

type sgNode struct {
	parent *sgNode
	tokens []uint32
	hashes []int64
}

func newSGLangTree(page int) *sglangTree { return &sglangTree{page: page, w: &mpw{}} }

// pageHash chains a page onto the previous page's hash.
func pageHash(prev int64, page []uint32) int64 {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(prev))
	h.Write(b[:])
	for _, t := range page {
		binary.BigEndian.PutUint32(b[:4], t)
		h.Write(b[:4])
	}
	return int64(h.Sum64())
}

// newNode makes a node of toks under parent, its page hashes chained from
// the parent's last.
func (s *sglangTree) newNode(parent *sgNode, toks []uint32) *sgNode {
	n := &sgNode{parent: parent, tokens: toks}
	prev := int64(0)
	if parent != nil && len(parent.hashes) > 0 {
		prev = parent.hashes[len(parent.hashes)-1]
	}
	for i := 0; i+s.page <= len(toks); i += s.page {
		prev = pageHash(prev, toks[i:i+s.page])
		n.hashes = append(n.hashes, prev)
	}
	return n
}

func (s *sglangTree) event() *mpw { s.n++; return s.w }

func (s *sglangTree) store(n *sgNode) {
	var parent *int64
	if n.parent != nil && len(n.parent.hashes) > 0 {
		p := n.parent.hashes[len(n.parent.hashes)-1]
		parent = &p
	}
	for i, h := range n.hashes {
		w := s.event().array(7).str("BlockStored").array(1).int(h)
		if parent == nil {
			w.nil()
		} else {
			w.int(*parent)
		}
		page := n.tokens[i*s.page : (i+1)*s.page]
		w.array(len(page))
		for _, t := range page {
			w.uint(uint64(t))
		}
		w.int(int64(s.page)).nil().str("GPU")
		p := h
		parent = &p
	}
}

func (s *sglangTree) remove(n *sgNode) {
	for _, h := range n.hashes {
		s.event().array(3).str("BlockRemoved").array(1).int(h).str("GPU")
	}
}

// split cuts n after k pages: the old node's pages removed, the upper
// half stored, then the lower half under it.
func (s *sglangTree) split(n *sgNode, k int) (upper, lower *sgNode) {
	s.remove(n)
	upper = &sgNode{parent: n.parent, tokens: n.tokens[:k*s.page], hashes: n.hashes[:k]}
	lower = &sgNode{parent: upper, tokens: n.tokens[k*s.page:], hashes: n.hashes[k:]}
	s.store(upper)
	s.store(lower)
	return upper, lower
}

// batch returns the events so far as one SGLang payload, [ts, events].
func (s *sglangTree) batch() []byte {
	out := (&mpw{}).array(2).float(1.5).array(s.n)
	out.b = append(out.b, s.w.b...)
	s.w, s.n = &mpw{}, 0
	return out.b
}

// TestSGLangEvents: SGLang's KV events, as its radix cache publishes them
// at page sizes 1 (its default: a block a token), 16 and 64, teach the
// index the prefixes the engine holds at kvgate's block size 16: a prompt,
// a second one sharing part of it (a node split), the first one's own
// part evicted.
func TestSGLangEvents(t *testing.T) {
	for _, page := range []int{1, 16, 64} {
		t.Run("page"+strconv.Itoa(page), func(t *testing.T) {
			idx := kvindex.New(kvindex.Config{BlockSize: 16})
			logs := &syncbuf.Buffer{}
			sub, err := New(Config{Engines: []EngineConfig{{Name: "sg:30000", Model: "m"}}, Logger: slog.New(slog.NewTextHandler(logs, nil))}, idx)
			if err != nil {
				t.Fatal(err)
			}
			st := sub.byTopic["sg:30000@m"]
			seq := uint64(0)
			send := func(payload []byte) {
				st.onFrames(context.Background(), [][]byte{[]byte("kv@sg:30000@m"), seq8(seq), payload})
				seq++
			}
			lookup := func(toks []uint32) int {
				return 16 * idx.Lookup("m", tokens.NewHasher(16).Keys(toks, nil), nil)[0].Blocks
			}
			shared := 5 * 64 // a multiple of every page size
			a := append(seqTokens(shared, 1), seqTokens(3*64, 2)...)
			b := append(seqTokens(shared, 1), seqTokens(2*64, 3)...)

			tr := newSGLangTree(page)
			na := tr.newNode(nil, a)
			tr.store(na)
			send(tr.batch())
			if got := lookup(a); got != len(a) {
				t.Fatalf("after prompt A: %d of %d tokens found", got, len(a))
			}
			upper, lowerA := tr.split(na, shared/page)
			nb := tr.newNode(upper, b[shared:])
			tr.store(nb)
			send(tr.batch())
			if got, got2 := lookup(a), lookup(b); got != len(a) || got2 != len(b) {
				t.Fatalf("after prompt B: A %d of %d, B %d of %d tokens found", got, len(a), got2, len(b))
			}
			tr.remove(lowerA)
			send(tr.batch())
			if got, got2 := lookup(a), lookup(b); got != shared || got2 != len(b) {
				t.Fatalf("after A's own part was evicted: A %d (want %d), B %d of %d", got, shared, got2, len(b))
			}
			// Page size 1 costs the map memory: the operator is told, once.
			if n, want := strings.Count(logs.String(), "much smaller than kvgate's"), map[bool]int{true: 1, false: 0}[page*4 <= 16]; n != want {
				t.Errorf("%d warnings about small blocks, want %d:\n%s", n, want, logs.String())
			}
			sn := statsOf(sub, "sg:30000")
			if sn.Malformed != 0 || sn.BadEvents != 0 || sn.OrphanBlocks != 0 || sn.UnknownRemoves != 0 {
				t.Errorf("stats %+v", sn)
			}
		})
	}
}
