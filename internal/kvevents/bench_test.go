package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// benchPayloads builds n batches, each one BlockStored of 16 blocks of 16
// tokens (a 256-token prompt), in vLLM v0.10/v0.11's positional form with
// 32-byte hashes, encoded as msgspec does (token ids in their smallest
// integer form, so 2- and 3-byte ids mix).
func benchPayloads(_ testing.TB, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		w := &mpw{}
		w.array(3).float(1.0).array(1).array(8).str("BlockStored").array(16)
		for j := range 16 {
			h := make([]byte, 32)
			binary.BigEndian.PutUint64(h[24:], uint64(i)<<8|uint64(j)+1)
			w.bin(h)
		}
		w.nil().array(256)
		for j := range 256 {
			w.uint(uint64(uint32(i*256+j) % 150000))
		}
		w.uint(16).nil().str("GPU").nil()
		w.uint(0)
		out[i] = w.b
	}
	return out
}

// benchMapPayloads builds the same batches as benchPayloads in the form
// current vLLM sends: an EventBatch map, each event a map with "type"
// first, integer hashes (64-bit, so 9 bytes each), extra_keys (one nil
// per block), group_idx and kv_cache_spec_kind.
func benchMapPayloads(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		ev := vllmStored{
			hashes: make([]uint64, 16), tokens: make([]uint32, 256), blockSize: 16,
			medium: ptr("GPU"), groupIdx: ptr(int64(0)), specKind: ptr("full_attention"),
			extraKeys: func(w *mpw) {
				w.array(16)
				for range 16 {
					w.nil()
				}
			},
		}
		for j := range ev.hashes {
			ev.hashes[j] = benchHash(uint64(i)<<8 | uint64(j))
		}
		for j := range ev.tokens {
			ev.tokens[j] = uint32(i*256+j) % 150000
		}
		out[i] = vllmBatch(1.0, ptr(int64(0)), ev.write)
	}
	return out
}

// benchHash spreads n over 64 bits with the top bit set, like a real
// hash in msgpack's 9-byte form.
func benchHash(n uint64) uint64 {
	n ^= n >> 33
	n *= 0xff51afd7ed558ccd
	n ^= n >> 33
	return n | 1<<63
}

// benchForms are the payload forms the ingest and decode benchmarks run
// on: the v0.11 positional form with 32-byte hashes and the current map
// form with integer hashes.
var benchForms = []struct {
	name  string
	build func(b testing.TB, n int) [][]byte
}{
	{"array-bin32", benchPayloads},
	{"map-int", func(_ testing.TB, n int) [][]byte { return benchMapPayloads(n) }},
}

const benchBatches = 4096 // 65 536 blocks per cycle

// BenchmarkIngest measures decode + engine→router mapping + index insert
// per batch of 16 BlockStored blocks, on one goroutine, for each form.
func BenchmarkIngest(b *testing.B) {
	for _, f := range benchForms {
		b.Run(f.name, func(b *testing.B) {
			payloads := f.build(b, benchBatches)
			idx := kvindex.New(kvindex.Config{BlockSize: 16})
			id, _ := idx.AddEndpoint("e", "m")
			st := &EngineStats{}
			m := newMapper(id, "m", 16, 1<<22, idx, st)
			var batch Batch
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := i % benchBatches
				if k == 0 && i > 0 {
					b.StopTimer()
					m.reset() // keep the working set at one cycle, as an engine's cache would
					b.StartTimer()
				}
				if err := Decode(payloads[k], &batch); err != nil {
					b.Fatal(err)
				}
				m.apply(&batch)
			}
			b.ReportMetric(float64(b.N)*16/b.Elapsed().Seconds(), "blocks/s")
			if st.orphans.Load() != 0 || st.storedBlocks.Load() == 0 {
				b.Fatalf("stats: %d orphans, %d stored", st.orphans.Load(), st.storedBlocks.Load())
			}
		})
	}
}

// naiveIndex is the baseline: generic msgpack decoding into interfaces, a
// map of sets of endpoint names, one mutex.
type naiveIndex struct {
	mu     sync.Mutex
	blocks map[uint64]map[string]struct{}
	eng    map[uint64]uint64 // engine hash → router key
}

func (n *naiveIndex) ingest(h *tokens.Hasher, payload []byte, ep string) error {
	var v any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		return err
	}
	var events []any
	switch x := v.(type) {
	case []any:
		events = x[1].([]any)
	case map[string]any:
		events = x["events"].([]any)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ev := range events {
		// Positional or map form, fields by name.
		var kind string
		var hashes, toks []any
		switch e := ev.(type) {
		case []any:
			kind = e[0].(string)
			if kind == "BlockStored" {
				hashes, toks = e[1].([]any), e[3].([]any)
			}
		case map[string]any:
			kind = e["type"].(string)
			if kind == "BlockStored" {
				hashes, toks = e["block_hashes"].([]any), e["token_ids"].([]any)
			}
		}
		if kind != "BlockStored" {
			continue
		}
		parent := tokens.RootKey
		ids := make([]uint32, len(toks))
		for i, t := range toks {
			ids[i] = uint32(naiveUint(t))
		}
		for j, hh := range hashes {
			var eh uint64
			if hb, ok := hh.([]byte); ok {
				eh = binary.BigEndian.Uint64(hb[len(hb)-8:])
			} else {
				eh = naiveUint(hh)
			}
			k := h.Key(parent, ids[j*16:(j+1)*16], nil)
			n.eng[eh] = k
			n.add(k, ep)
			parent = k
		}
	}
	return nil
}

// add records that ep holds router key k. Caller holds n.mu (or owns n).
func (n *naiveIndex) add(k uint64, ep string) {
	s := n.blocks[k]
	if s == nil {
		s = map[string]struct{}{}
		n.blocks[k] = s
	}
	s[ep] = struct{}{}
}

// naiveUint is the value of any integer msgpack.Unmarshal returns.
func naiveUint(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case uint32:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint8:
		return uint64(x)
	case int64:
		return uint64(x)
	case int32:
		return uint64(x)
	case int16:
		return uint64(x)
	case int8:
		return uint64(x)
	}
	return 0
}

func BenchmarkIngestNaive(b *testing.B) {
	for _, f := range benchForms {
		b.Run(f.name, func(b *testing.B) {
			payloads := f.build(b, benchBatches)
			n := &naiveIndex{blocks: map[uint64]map[string]struct{}{}, eng: map[uint64]uint64{}}
			h := tokens.NewHasher(16)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := i % benchBatches
				if k == 0 && i > 0 {
					b.StopTimer()
					n.blocks, n.eng = map[uint64]map[string]struct{}{}, map[uint64]uint64{}
					b.StartTimer()
				}
				if err := n.ingest(h, payloads[k], "127.0.0.1:8001"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*16/b.Elapsed().Seconds(), "blocks/s")
			if len(n.blocks) == 0 {
				b.Fatal("nothing ingested")
			}
		})
	}
}

// BenchmarkDecode is the decoder alone, for each form.
func BenchmarkDecode(b *testing.B) {
	for _, f := range benchForms {
		b.Run(f.name, func(b *testing.B) {
			payloads := f.build(b, 64)
			var batch Batch
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := Decode(payloads[i%64], &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*16/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// decodeWithLib decodes the benchmark's payloads (the positional form:
// [ts, [["BlockStored", hashes, parent, token_ids, block_size, lora_id,
// medium, lora_name, ...]], dp_rank]) into a Batch with
// vmihailenco/msgpack's low-level Decoder API — no reflection, no
// interface values, byte strings read into a scratch buffer — so that the
// comparison with Decode is about the reader, not about reflection. It
// handles only that form (Decode also takes the map forms, integer
// hashes, all integer widths).
func decodeWithLib(d *msgpack.Decoder, br *bytes.Reader, payload []byte, b *Batch, scratch []byte) error {
	br.Reset(payload)
	d.Reset(br)
	b.Events, b.DPRank, b.HasDPRank = b.Events[:0], 0, false
	if _, err := d.DecodeArrayLen(); err != nil {
		return err
	}
	var err error
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return err
	}
	nev, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	readBytes := func() ([]byte, error) {
		n, err := d.DecodeBytesLen()
		if err != nil || n < 0 || n > len(scratch) {
			return nil, fmt.Errorf("bytes: %v (len %d)", err, n)
		}
		return scratch[:n], d.ReadFull(scratch[:n])
	}
	isNil := func() bool {
		c, err := d.PeekCode()
		if err == nil && c == 0xc0 {
			_ = d.DecodeNil()
			return true
		}
		return false
	}
	for j := 0; j < nev; j++ {
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		e := &b.Events[len(b.Events)-1]
		resetEvent(e)
		nf, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		tag, err := readBytes()
		if err != nil {
			return err
		}
		if e.Kind = kindOf(tag); e.Kind != KindBlockStored || nf < 5 {
			return fmt.Errorf("unexpected event %q", tag)
		}
		nh, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		for k := 0; k < nh; k++ {
			h, err := readBytes()
			if err != nil || len(h) < 8 {
				return fmt.Errorf("hash: %v", err)
			}
			e.BlockHashes = append(e.BlockHashes, binary.BigEndian.Uint64(h[len(h)-8:]))
		}
		if !isNil() {
			h, err := readBytes()
			if err != nil || len(h) < 8 {
				return fmt.Errorf("parent: %v", err)
			}
			e.Parent, e.HasParent = binary.BigEndian.Uint64(h[len(h)-8:]), true
		}
		nt, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		for k := 0; k < nt; k++ {
			v, err := d.DecodeUint32()
			if err != nil {
				return err
			}
			e.TokenIDs = append(e.TokenIDs, v)
		}
		if e.BlockSize, err = d.DecodeInt(); err != nil {
			return err
		}
		for f := 5; f < nf; f++ {
			switch f {
			case 6: // medium
				if !isNil() {
					s, err := readBytes()
					if err != nil {
						return err
					}
					e.Medium = kvindex.ParseMedium(string(s))
				}
			default:
				if err := d.Skip(); err != nil {
					return err
				}
			}
		}
	}
	if !isNil() {
		if b.DPRank, err = d.DecodeInt(); err != nil {
			return err
		}
		b.HasDPRank = true
	}
	return nil
}

// BenchmarkDecodeMsgpackLib decodes the same payloads as BenchmarkDecode
// with vmihailenco/msgpack's low-level Decoder API (decodeWithLib).
func BenchmarkDecodeMsgpackLib(b *testing.B) {
	payloads := benchPayloads(b, 64)
	var batch, want Batch
	d := msgpack.NewDecoder(nil)
	br := bytes.NewReader(nil)
	scratch := make([]byte, 256)
	for _, p := range payloads[:4] { // same result as Decode
		if err := decodeWithLib(d, br, p, &batch, scratch); err != nil {
			b.Fatal(err)
		}
		if err := Decode(p, &want); err != nil {
			b.Fatal(err)
		}
		if fmt.Sprint(batch) != fmt.Sprint(want) {
			b.Fatalf("decodeWithLib %v, Decode %v", batch, want)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := decodeWithLib(d, br, payloads[i%64], &batch, scratch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*16/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkDecodeMsgpackReflect decodes them with msgpack.Unmarshal into
// interface values, as the naive ingest baseline does (no conversion to
// a Batch counted).
func BenchmarkDecodeMsgpackReflect(b *testing.B) {
	payloads := benchPayloads(b, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var v []any
		if err := msgpack.Unmarshal(payloads[i%64], &v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*16/b.Elapsed().Seconds(), "blocks/s")
}

func heapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// benchMemory reports heap bytes per (block, endpoint) entry for 1 Mi
// entries over 64 engines, each block held by `holders` engines, built
// from BlockStored events of 16-token blocks as an engine sends them: the
// index table alone ("index-B/entry", from its slot arrays), the
// engine→router key maps ("map-B/entry", one 40-byte slot per engine
// block) and both with everything else ("B/entry", heap growth). The
// naive baseline keeps a map of endpoint-name sets per router key and a
// Go map per engine from engine hash to router key.
func benchMemory(b *testing.B, holders int, useNaive bool) {
	const (
		engines = 64
		entries = 1 << 20
		chunk   = 256 // blocks per BlockStored event
	)
	blocks := entries / holders
	perEngine := blocks * holders / engines // each engine's share of the chains
	toks := make([]uint32, chunk*16)
	hs := make([]uint64, chunk)
	// events calls f with the BlockStored events of engine e: a chain of
	// perEngine blocks, the same for engines e, e+64/holders, ...
	events := func(e int, f func(ev *Event)) {
		lo := (e % (engines / holders)) * perEngine
		for start := lo; start < lo+perEngine; start += chunk {
			n := min(chunk, lo+perEngine-start)
			for j := range n * 16 {
				toks[j] = uint32((start*16 + j) % 150000)
			}
			for j := range n {
				hs[j] = benchHash(uint64(start + j))
			}
			ev := Event{Kind: KindBlockStored, BlockHashes: hs[:n], TokenIDs: toks[:n*16], BlockSize: 16, Medium: kvindex.TierGPU}
			if start > lo { // each engine's range is a chain of its own
				ev.Parent, ev.HasParent = benchHash(uint64(start-1)), true
			}
			f(&ev)
		}
	}
	for i := 0; i < b.N; i++ {
		before := heapBytes()
		var keep any
		var indexBytes, mapBytes int64
		if useNaive {
			n := &naiveIndex{blocks: map[uint64]map[string]struct{}{}}
			engs := make([]map[uint64]uint64, engines)
			h := tokens.NewHasher(16)
			for e := range engines {
				name := fmt.Sprintf("10.0.0.%d:8000", e)
				engs[e] = map[uint64]uint64{}
				parent := tokens.RootKey
				events(e, func(ev *Event) {
					if ev.HasParent {
						parent = engs[e][ev.Parent]
					}
					for j, eh := range ev.BlockHashes {
						k := h.Key(parent, ev.TokenIDs[j*16:(j+1)*16], nil)
						engs[e][eh] = k
						n.add(k, name)
						parent = k
					}
				})
			}
			keep = []any{n, engs}
		} else {
			idx := kvindex.New(kvindex.Config{BlockSize: 16})
			ms := make([]*mapper, engines)
			for e := range ms {
				id, _ := idx.AddEndpoint(fmt.Sprintf("10.0.0.%d:8000", e), "m")
				ms[e] = newMapper(id, "m", 16, 1<<21, idx, &EngineStats{})
				var batch Batch
				events(e, func(ev *Event) {
					batch.Events = append(batch.Events[:0], *ev)
					ms[e].apply(&batch)
				})
				if ms[e].st.orphans.Load() != 0 {
					b.Fatal("orphans")
				}
				mapBytes += int64(len(ms[e].nodes.slots)) * int64(unsafe.Sizeof(nodeSlot{}))
			}
			if got := idx.Mem().Keys; got != int64(blocks) {
				b.Fatalf("index holds %d keys, want %d", got, blocks)
			}
			indexBytes = idx.Mem().Bytes
			keep = []any{idx, ms}
		}
		after := heapBytes()
		runtime.KeepAlive(keep)
		b.ReportMetric(float64(after-before)/entries, "B/entry")
		if !useNaive {
			b.ReportMetric(float64(indexBytes)/entries, "index-B/entry")
			b.ReportMetric(float64(mapBytes)/entries, "map-B/entry")
		}
	}
}

// BenchmarkMemoryPerEntry is kvindex's BenchmarkMemoryPerEntry with the
// engine→router key maps counted (run with -benchtime 1x).
func BenchmarkMemoryPerEntry(b *testing.B) {
	for _, holders := range []int{1, 4} {
		b.Run(fmt.Sprintf("holders=%d", holders), func(b *testing.B) { benchMemory(b, holders, false) })
		b.Run(fmt.Sprintf("holders=%d/naive", holders), func(b *testing.B) { benchMemory(b, holders, true) })
	}
}

// BenchmarkFeederCheck: central mode checks each frame's connection
// against its endpoint's feeder (Subscriber.fedBy). By the address value
// the connection's frames share, against formatting both addresses, as
// the first version of the check did, in the same run.
func BenchmarkFeederCheck(b *testing.B) {
	feeder := net.Addr(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 43512})
	from := feeder
	b.Run("value", func(b *testing.B) {
		n := 0
		for range b.N {
			if from == feeder {
				n++
			}
		}
		_ = n
	})
	b.Run("strings", func(b *testing.B) {
		n := 0
		for range b.N {
			if feeder.String() == from.String() {
				n++
			}
		}
		_ = n
	})
}
