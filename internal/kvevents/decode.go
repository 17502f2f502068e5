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
			key, err := r.bytesOrStr()
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

// Positional field order per kind (after the tag).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
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
		tag, err := r.bytesOrStr()
		if err != nil {
			// Integer tags or other forms: unknown kind, skip the rest.
			if kerr := r.skip(); kerr != nil {
				return kerr
			}
			e.Kind = KindUnknown
			return skipN(r, n-1)
		}
		e.Kind = kindOf(tag)
		var fields []string
		switch e.Kind {
		case KindBlockStored:
			fields = storedFields
		case KindBlockRemoved:
			fields = removedFields
		}
		for j := 1; j < n; j++ {
			name := ""
			if j-1 < len(fields) {
				name = fields[j-1]
			}
			if err := decodeField(r, e, name); err != nil {
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
			key, err := r.bytesOrStr()
			if err != nil {
				return fmt.Errorf("event map key: %w", err)
			}
			if string(key) == "type" {
				tag, err := r.bytesOrStr()
				if err != nil {
					return fmt.Errorf("type: %w", err)
				}
				e.Kind = kindOf(tag)
				sawType = true
				continue
			}
			if err := decodeField(r, e, string(key)); err != nil {
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

// decodeField decodes one named field into e; unknown names are skipped.
func decodeField(r *reader, e *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		err = decodeHashes(r, e)
	case "parent_block_hash":
		if !r.isNil() {
			e.Parent, err = r.hash()
			e.HasParent = err == nil
		}
	case "token_ids":
		err = decodeTokens(r, e)
	case "block_size":
		var v int64
		if v, err = r.int(); err == nil {
			if v <= 0 || v > 1<<20 {
				err = fmt.Errorf("block_size %d out of range", v)
			}
			e.BlockSize = int(v)
		}
	case "lora_id":
		if !r.isNil() {
			e.LoRAID, err = r.int()
			e.HasLoRAID = err == nil
		}
	case "medium":
		if !r.isNil() {
			var s []byte
			if s, err = r.bytesOrStr(); err == nil {
				e.Medium = kvindex.ParseMedium(string(s))
			}
		}
	case "lora_name":
		if !r.isNil() {
			var s []byte
			if s, err = r.bytesOrStr(); err == nil {
				e.LoRAName = string(s)
			}
		}
	case "group_idx":
		if !r.isNil() {
			var v int64
			if v, err = r.int(); err == nil {
				if v < 0 || v > maxGroups-1 {
					err = fmt.Errorf("group_idx %d out of range", v)
				}
				e.Group = int(v)
			}
		}
	case "kv_cache_spec_kind":
		if !r.isNil() {
			var s []byte
			if s, err = r.bytesOrStr(); err == nil {
				e.GroupKind, e.HasGroupKind = kvindex.ParseGroupKind(string(s)), true
			}
		}
	case "kv_cache_spec_sliding_window", "sliding_window":
		if !r.isNil() {
			var v int64
			if v, err = r.int(); err == nil {
				if v < 0 || v > 1<<30 {
					err = fmt.Errorf("sliding window %d out of range", v)
				}
				e.Window = int(v)
			}
		}
	case "extra_keys":
		if !r.isNil() {
			err = decodeExtraKeys(r, e)
		}
	default: // anything unknown
		err = r.skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
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
