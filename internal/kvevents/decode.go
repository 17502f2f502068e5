package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/internal/kvindex"
)

// Kind is the type of one KV-cache event.
type Kind uint8

// Event kinds. KindUnknown is an event type this decoder does not know; it
// is skipped, not an error.
const (
	KindUnknown Kind = iota
	KindBlockStored
	KindBlockRemoved
	KindAllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one decoded vLLM KV-cache event. Fields not carried by an event's
// kind are zero.
type Event struct {
	Kind         Kind
	BlockHashes  []uint64 // engine block hashes (bytes hashes: last 8 bytes, big-endian)
	Parent       uint64   // parent_block_hash, valid when HasParent
	HasParent    bool
	TokenIDs     []uint32 // BlockStored: the tokens of all stored blocks, in order
	BlockSize    int      // BlockStored: engine block size in tokens
	LoRAID       int64    // deprecated lora_id, valid when HasLoRAID
	HasLoRAID    bool
	LoRAName     string
	Medium       kvindex.Tier      // nil medium = GPU
	Group        int               // group_idx, 0 when absent
	GroupKind    kvindex.GroupKind // kv_cache_spec_kind, valid when HasGroupKind
	HasGroupKind bool
	Window       int // kv_cache_spec_sliding_window in tokens, 0 when absent
	// ExtraKeys is, per stored block, the raw msgpack of its extra_keys
	// entry (multimodal hashes, LoRA name, cache salt, prompt-embedding
	// hashes), nil for a nil entry; empty when the field is absent or nil.
	// The slices point into the payload: valid until it is reused.
	ExtraKeys [][]byte
}

// Batch is one decoded payload: [ts, [events...], data_parallel_rank] or the
// equivalent map.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int
	HasDPRank bool
}

// ErrMalformed wraps every structural decoding error.
var ErrMalformed = errors.New("kvevents: malformed payload")

// Decode decodes one payload into b, reusing b's slices. On error b is left
// in an unspecified state. Decode never panics and allocates only to grow
// b's slices (and for LoRA names).
func Decode(payload []byte, b *Batch) error {
	r := reader{b: payload}
	if err := decodeBatch(&r, b); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

func decodeBatch(r *reader, b *Batch) error {
	b.TS, b.DPRank, b.HasDPRank = 0, 0, false
	b.Events = b.Events[:0]
	k, err := r.peekKind()
	if err != nil {
		return err
	}
	switch k {
	case mpArray:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("batch array has %d elements, want ≥ 2", n)
		}
		if b.TS, err = r.float(); err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		if err := decodeEvents(r, b); err != nil {
			return err
		}
		if n >= 3 {
			if err := decodeDPRank(r, b); err != nil {
				return err
			}
		}
		for j := 3; j < n; j++ {
			if err := r.skip(); err != nil {
				return err
			}
		}
	case mpMap:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		sawEvents := false
		for j := 0; j < n; j++ {
			key, err := r.str()
			if err != nil {
				return fmt.Errorf("batch map key: %w", err)
			}
			switch string(key) {
			case "ts":
				if b.TS, err = r.float(); err != nil {
					return fmt.Errorf("ts: %w", err)
				}
			case "events":
				if err := decodeEvents(r, b); err != nil {
					return err
				}
				sawEvents = true
			case "data_parallel_rank":
				if err := decodeDPRank(r, b); err != nil {
					return err
				}
			default:
				if err := r.skip(); err != nil {
					return err
				}
			}
		}
		if !sawEvents {
			return errors.New("batch map has no events")
		}
	default:
		return errors.New("batch is neither an array nor a map")
	}
	if !r.done() {
		return fmt.Errorf("%d trailing bytes", len(r.b)-r.i)
	}
	return nil
}

func decodeDPRank(r *reader, b *Batch) error {
	if r.isNil() {
		return nil
	}
	v, err := r.int()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	b.DPRank, b.HasDPRank = int(v), true
	return nil
}

func decodeEvents(r *reader, b *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for j := 0; j < n; j++ {
		// Reuse the slot (and its slices) left from earlier batches.
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		e := &b.Events[len(b.Events)-1]
		resetEvent(e)
		if err := decodeEvent(r, e); err != nil {
			return fmt.Errorf("event %d: %w", j, err)
		}
	}
	return nil
}

func resetEvent(e *Event) {
	*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0], ExtraKeys: e.ExtraKeys[:0], Medium: kvindex.TierGPU}
}

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return KindUnknown
}

// field names an event field the decoder knows; fieldSkip is every other.
type field uint8

const (
	fieldSkip field = iota
	fieldBlockHashes
	fieldParent
	fieldTokenIDs
	fieldBlockSize
	fieldLoRAID
	fieldMedium
	fieldLoRAName
	fieldExtraKeys
	fieldGroupIdx
	fieldSpecKind
	fieldSpecWindow
)

var fieldNames = [...]string{
	fieldSkip: "unknown field", fieldBlockHashes: "block_hashes", fieldParent: "parent_block_hash",
	fieldTokenIDs: "token_ids", fieldBlockSize: "block_size", fieldLoRAID: "lora_id", fieldMedium: "medium",
	fieldLoRAName: "lora_name", fieldExtraKeys: "extra_keys", fieldGroupIdx: "group_idx",
	fieldSpecKind: "kv_cache_spec_kind", fieldSpecWindow: "kv_cache_spec_sliding_window",
}

// fieldOf names a map event's key. A switch on string(key) compiles to
// comparisons without converting (allocating) the key.
func fieldOf(key []byte) field {
	switch string(key) {
	case "block_hashes":
		return fieldBlockHashes
	case "parent_block_hash":
		return fieldParent
	case "token_ids":
		return fieldTokenIDs
	case "block_size":
		return fieldBlockSize
	case "lora_id":
		return fieldLoRAID
	case "medium":
		return fieldMedium
	case "lora_name":
		return fieldLoRAName
	case "extra_keys":
		return fieldExtraKeys
	case "group_idx":
		return fieldGroupIdx
	case "kv_cache_spec_kind":
		return fieldSpecKind
	case "kv_cache_spec_sliding_window", "sliding_window":
		return fieldSpecWindow
	}
	return fieldSkip
}

// Positional field order per kind (after the tag).
var (
	storedFields = []field{fieldBlockHashes, fieldParent, fieldTokenIDs, fieldBlockSize, fieldLoRAID, fieldMedium,
		fieldLoRAName, fieldExtraKeys, fieldGroupIdx, fieldSpecKind, fieldSpecWindow}
	removedFields = []field{fieldBlockHashes, fieldMedium, fieldGroupIdx}
)

func decodeEvent(r *reader, e *Event) error {
	k, err := r.peekKind()
	if err != nil {
		return err
	}
	switch k {
	case mpArray:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("empty event array")
		}
		tag, err := r.str()
		if err != nil {
			// Integer tags or other forms: unknown kind, skip the rest.
			if kerr := r.skip(); kerr != nil {
				return kerr
			}
			e.Kind = KindUnknown
			return skipN(r, n-1)
		}
		e.Kind = kindOf(tag)
		var fields []field
		switch e.Kind {
		case KindBlockStored:
			fields = storedFields
		case KindBlockRemoved:
			fields = removedFields
		}
		for j := 1; j < n; j++ {
			f := fieldSkip
			if j-1 < len(fields) {
				f = fields[j-1]
			}
			if err := decodeField(r, e, f); err != nil {
				return err
			}
		}
	case mpMap:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		sawType := false
		for j := 0; j < n; j++ {
			key, err := r.str()
			if err != nil {
				return fmt.Errorf("event map key: %w", err)
			}
			if string(key) == "type" {
				tag, err := r.str()
				if err != nil {
					return fmt.Errorf("type: %w", err)
				}
				e.Kind = kindOf(tag)
				sawType = true
				continue
			}
			if err := decodeField(r, e, fieldOf(key)); err != nil {
				return err
			}
		}
		if !sawType {
			return errors.New("event map has no type")
		}
	default:
		return errors.New("event is neither an array nor a map")
	}
	return nil
}

func skipN(r *reader, n int) error {
	for j := 0; j < n; j++ {
		if err := r.skip(); err != nil {
			return err
		}
	}
	return nil
}

// decodeField decodes field f into e; fieldSkip (unknown names) is
// skipped.
func decodeField(r *reader, e *Event, f field) error {
	var err error
	switch f {
	case fieldBlockHashes:
		err = decodeHashes(r, e)
	case fieldParent:
		if !r.isNil() {
			e.Parent, err = r.hash()
			e.HasParent = err == nil
		}
	case fieldTokenIDs:
		err = decodeTokens(r, e)
	case fieldBlockSize:
		var v int64
		if v, err = r.int(); err == nil {
			if v <= 0 || v > 1<<20 {
				err = fmt.Errorf("block_size %d out of range", v)
			}
			e.BlockSize = int(v)
		}
	case fieldLoRAID:
		if !r.isNil() {
			e.LoRAID, err = r.int()
			e.HasLoRAID = err == nil
		}
	case fieldMedium:
		if !r.isNil() {
			var s []byte
			if s, err = r.str(); err == nil {
				e.Medium = parseMedium(s)
			}
		}
	case fieldLoRAName:
		if !r.isNil() {
			var s []byte
			if s, err = r.bytesOrStr(); err == nil {
				e.LoRAName = string(s)
			}
		}
	case fieldGroupIdx:
		if !r.isNil() {
			var v int64
			if v, err = r.int(); err == nil {
				if v < 0 || v > maxGroups-1 {
					err = fmt.Errorf("group_idx %d out of range", v)
				}
				e.Group = int(v)
			}
		}
	case fieldSpecKind:
		if !r.isNil() {
			var s []byte
			if s, err = r.str(); err == nil {
				e.GroupKind, e.HasGroupKind = parseGroupKind(s), true
			}
		}
	case fieldSpecWindow:
		if !r.isNil() {
			var v int64
			if v, err = r.int(); err == nil {
				if v < 0 || v > 1<<30 {
					err = fmt.Errorf("sliding window %d out of range", v)
				}
				e.Window = int(v)
			}
		}
	case fieldExtraKeys:
		if !r.isNil() {
			err = decodeExtraKeys(r, e)
		}
	default: // anything unknown
		err = r.skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", fieldNames[f], err)
	}
	return nil
}

// decodeExtraKeys keeps each block's extra_keys entry as raw msgpack.
func decodeExtraKeys(r *reader, e *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	for j := 0; j < n; j++ {
		if r.isNil() {
			e.ExtraKeys = append(e.ExtraKeys, nil)
			continue
		}
		start := r.i
		if err := r.skip(); err != nil {
			return err
		}
		e.ExtraKeys = append(e.ExtraKeys, r.b[start:r.i:r.i])
	}
	return nil
}

// onlyLoRA reports whether a block's raw extra_keys entry carries nothing
// the router's keys lack: an empty array, or strings equal to the LoRA
// name (vLLM lists the adapter's name among a block's extra keys).
func onlyLoRA(raw []byte, lora string) bool {
	r := reader{b: raw}
	n, err := r.arrayLen()
	if err != nil {
		return false
	}
	for j := 0; j < n; j++ {
		if k, err := r.peekKind(); err != nil || k != mpStr {
			return false
		}
		s, err := r.bytesOrStr()
		if err != nil || string(s) != lora {
			return false
		}
	}
	return r.done()
}

// parseMedium is kvindex.ParseMedium with vLLM's own spellings first
// (they need no case folding).
func parseMedium(s []byte) kvindex.Tier {
	switch string(s) {
	case "GPU":
		return kvindex.TierGPU
	case "CPU":
		return kvindex.TierCPU
	}
	return kvindex.ParseMedium(string(s))
}

// parseGroupKind is kvindex.ParseGroupKind with the common kind first.
func parseGroupKind(s []byte) kvindex.GroupKind {
	if string(s) == "full_attention" {
		return kvindex.GroupFullAttention
	}
	return kvindex.ParseGroupKind(string(s))
}

// maxGroups bounds group_idx (hybrid models have a handful of groups).
const maxGroups = 16

func decodeHashes(r *reader, e *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	hs := e.BlockHashes
	if cap(hs) < n {
		hs = make([]uint64, n)
	}
	hs = hs[:n]
	e.BlockHashes = hs
	for j := range hs {
		// Fast paths: bin 8 with ≥ 8 bytes (vLLM's 32-byte hashes) and
		// uint64 (older vLLM's integer hashes).
		if b := r.b[r.i:]; len(b) >= 10 {
			if c, l := b[0], int(b[1]); c == 0xc4 && l >= 8 && l+2 <= len(b) {
				hs[j] = binary.BigEndian.Uint64(b[l-6 : l+2])
				r.i += l + 2
				continue
			} else if c == 0xcf {
				hs[j] = binary.BigEndian.Uint64(b[1:9])
				r.i += 9
				continue
			}
		}
		h, err := r.hash()
		if err != nil {
			return err
		}
		hs[j] = h
	}
	return nil
}

func decodeTokens(r *reader, e *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	ts := e.TokenIDs
	if cap(ts) < n {
		ts = make([]uint32, n)
	}
	ts = ts[:n]
	e.TokenIDs = ts
	b := r.b
	i := r.i
	for j := range ts {
		// Fast path: positive fixint and uint8/16/32 with 5 bytes left.
		if i+5 <= len(b) {
			w := b[i : i+5 : i+5]
			switch c := w[0]; {
			case c <= 0x7f:
				ts[j] = uint32(c)
				i++
				continue
			case c == 0xcd:
				ts[j] = uint32(binary.BigEndian.Uint16(w[1:3]))
				i += 3
				continue
			case c == 0xce:
				ts[j] = binary.BigEndian.Uint32(w[1:5])
				i += 5
				continue
			case c == 0xcc:
				ts[j] = uint32(w[1])
				i += 2
				continue
			}
		}
		r.i = i
		v, neg, err := r.intRaw()
		if err != nil {
			return err
		}
		if neg || v > 0xffffffff {
			return fmt.Errorf("token id %d out of range", int64(v))
		}
		ts[j] = uint32(v)
		i = r.i
	}
	r.i = i
	return nil
}
