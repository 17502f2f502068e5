// Package kvpub publishes vLLM-compatible KV-cache events over ZeroMQ: a PUB
// socket sending [topic, seq, payload] multipart messages and an optional
// ROUTER socket replaying a bounded buffer of recent batches.
//
// Wire format (as vLLM's ZmqEventPublisher): seq is an 8-byte big-endian
// integer starting at 0; payload is msgpack [ts float64, [events...],
// data_parallel_rank]. Events are tagged structs, encoded either as
// positional arrays with the tag first (vLLM <= 0.23, msgspec array_like) or
// as maps with a "type" key (newer vLLM).
package kvpub

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Format selects how events are encoded.
type Format int

const (
	// FormatArray encodes events as positional arrays, tag first.
	FormatArray Format = iota
	// FormatMap encodes events as maps with a "type" key.
	FormatMap
)

// ParseFormat parses "array" or "map".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "array", "":
		return FormatArray, nil
	case "map":
		return FormatMap, nil
	}
	return 0, fmt.Errorf("kv events format must be array or map, got %q", s)
}

func (f Format) String() string {
	if f == FormatMap {
		return "map"
	}
	return "array"
}

// Style selects how batches are numbered and a chain start is marked.
type Style int

const (
	// StyleVLLM is vLLM's: batches numbered from 0, parent_block_hash nil
	// for the first block of a chain.
	StyleVLLM Style = iota
	// StyleLLMDSim is llm-d-inference-sim's: batches numbered from 1 and,
	// in the array form, parent_block_hash 0 for the first block of a
	// chain (nil in the map form, as it does).
	StyleLLMDSim
)

// ParseStyle parses "vllm" or "llmd-sim".
func ParseStyle(s string) (Style, error) {
	switch s {
	case "vllm", "":
		return StyleVLLM, nil
	case "llmd-sim":
		return StyleLLMDSim, nil
	}
	return 0, fmt.Errorf("kv events style must be vllm or llmd-sim, got %q", s)
}

func (s Style) String() string {
	if s == StyleLLMDSim {
		return "llmd-sim"
	}
	return "vllm"
}

// firstSeq is the sequence number of the first batch.
func (s Style) firstSeq() uint64 {
	if s == StyleLLMDSim {
		return 1
	}
	return 0
}

// MediumGPU is the storage medium of every block the emulator stores.
const MediumGPU = "GPU"

// Event is one KV-cache event: *BlockStored, *BlockRemoved or
// *AllBlocksCleared.
type Event interface {
	encode(e *msgpack.Encoder, f Format, s Style) error
}

// BlockStored reports full blocks that entered the prefix cache, in chain
// order: Hashes[0]'s parent is Parent (nil for the first block of a
// sequence), Hashes[i]'s parent is Hashes[i-1]. TokenIDs holds the tokens of
// all the blocks, BlockSize per block.
type BlockStored struct {
	Hashes    []uint64
	Parent    *uint64
	TokenIDs  []uint32
	BlockSize int
	// LoRAID and LoRAName are the blocks' LoRA adapter (0 and "": the
	// base model), sent as lora_id and lora_name (nil for the base model).
	LoRAID   int
	LoRAName string
}

// BlockRemoved reports blocks evicted from the prefix cache.
type BlockRemoved struct {
	Hashes []uint64
}

// AllBlocksCleared reports that the whole prefix cache was reset.
type AllBlocksCleared struct{}

func encodeHashes(e *msgpack.Encoder, hs []uint64) error {
	if err := e.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := e.EncodeUint(h); err != nil {
			return err
		}
	}
	return nil
}

func (b *BlockStored) encode(e *msgpack.Encoder, f Format, s Style) error {
	var err error
	key := func(k string) {
		if f == FormatMap && err == nil {
			err = e.EncodeString(k)
		}
	}
	if f == FormatMap {
		err = e.EncodeMapLen(8)
		key("type")
	} else {
		err = e.EncodeArrayLen(8)
	}
	if err == nil {
		err = e.EncodeString("BlockStored")
	}
	key("block_hashes")
	if err == nil {
		err = encodeHashes(e, b.Hashes)
	}
	key("parent_block_hash")
	if err == nil {
		switch {
		case b.Parent == nil && s == StyleLLMDSim && f == FormatArray:
			err = e.EncodeUint(0)
		case b.Parent == nil:
			err = e.EncodeNil()
		default:
			err = e.EncodeUint(*b.Parent)
		}
	}
	key("token_ids")
	if err == nil {
		err = e.EncodeArrayLen(len(b.TokenIDs))
		for _, t := range b.TokenIDs {
			if err != nil {
				break
			}
			err = e.EncodeUint(uint64(t))
		}
	}
	key("block_size")
	if err == nil {
		err = e.EncodeUint(uint64(b.BlockSize))
	}
	key("lora_id")
	if err == nil {
		if b.LoRAID > 0 {
			err = e.EncodeInt(int64(b.LoRAID))
		} else {
			err = e.EncodeNil()
		}
	}
	key("medium")
	if err == nil {
		err = e.EncodeString(MediumGPU)
	}
	key("lora_name")
	if err == nil {
		if b.LoRAName != "" {
			err = e.EncodeString(b.LoRAName)
		} else {
			err = e.EncodeNil()
		}
	}
	return err
}

func (b *BlockRemoved) encode(e *msgpack.Encoder, f Format, _ Style) error {
	var err error
	if f == FormatMap {
		err = e.EncodeMapLen(3)
		if err == nil {
			err = e.EncodeString("type")
		}
	} else {
		err = e.EncodeArrayLen(3)
	}
	if err == nil {
		err = e.EncodeString("BlockRemoved")
	}
	if err == nil && f == FormatMap {
		err = e.EncodeString("block_hashes")
	}
	if err == nil {
		err = encodeHashes(e, b.Hashes)
	}
	if err == nil && f == FormatMap {
		err = e.EncodeString("medium")
	}
	if err == nil {
		err = e.EncodeString(MediumGPU)
	}
	return err
}

func (AllBlocksCleared) encode(e *msgpack.Encoder, f Format, _ Style) error {
	if f == FormatMap {
		if err := e.EncodeMapLen(1); err != nil {
			return err
		}
		if err := e.EncodeString("type"); err != nil {
			return err
		}
	} else if err := e.EncodeArrayLen(1); err != nil {
		return err
	}
	return e.EncodeString("AllBlocksCleared")
}

// EncodeBatch encodes one event batch: [ts, [events...], data_parallel_rank].
func EncodeBatch(f Format, s Style, ts float64, events []Event) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := e.EncodeArrayLen(3); err != nil {
		return nil, err
	}
	if err := e.EncodeFloat64(ts); err != nil {
		return nil, err
	}
	if err := e.EncodeArrayLen(len(events)); err != nil {
		return nil, err
	}
	for _, ev := range events {
		if err := ev.encode(e, f, s); err != nil {
			return nil, fmt.Errorf("encode kv event: %w", err)
		}
	}
	if err := e.EncodeInt(0); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
