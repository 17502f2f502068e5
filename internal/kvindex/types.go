package kvindex

import "strings"

// Tier is where an engine holds a block. Smaller is faster.
type Tier uint8

// Tiers, fastest first.
const (
	TierNone    Tier = 0
	TierGPU     Tier = 1
	TierCPU     Tier = 2
	TierStorage Tier = 3
)

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierStorage:
		return "storage"
	}
	return "none"
}

// ParseMedium maps a vLLM "medium" string to a tier, case-insensitively:
// "" (nil) and anything naming a GPU are GPU, anything naming a CPU is CPU,
// every other medium (disk, storage, remote stores) is storage.
func ParseMedium(s string) Tier {
	if s == "" {
		return TierGPU
	}
	u := strings.ToUpper(s)
	switch {
	case strings.Contains(u, "GPU") || strings.Contains(u, "CUDA") || strings.Contains(u, "HBM"):
		return TierGPU
	case strings.Contains(u, "CPU") || strings.Contains(u, "DRAM") || strings.Contains(u, "HOST"):
		return TierCPU
	}
	return TierStorage
}

// GroupKind is the kind of a KV-cache group of a (hybrid) model.
type GroupKind uint8

// Group kinds. A prefix is usable only as far as every full-attention group
// holds all of it and every windowed group holds the blocks its window needs
// at the end of the prefix.
const (
	GroupFullAttention GroupKind = iota
	// GroupSlidingWindow needs only the blocks covering the last window
	// (sliding-window and chunked-local attention).
	GroupSlidingWindow
	// GroupState needs only the block at the end of the prefix (mamba and
	// other recurrent state groups).
	GroupState
)

func (k GroupKind) String() string {
	switch k {
	case GroupSlidingWindow:
		return "sliding_window"
	case GroupState:
		return "state"
	}
	return "full_attention"
}

// ParseGroupKind maps vLLM's kv_cache_spec_kind ("full_attention",
// "sliding_window", "chunked_local_attention", "mamba", ...) to a GroupKind.
// Empty means full attention.
func ParseGroupKind(s string) GroupKind {
	u := strings.ToLower(s)
	switch {
	case u == "" || strings.Contains(u, "full") || u == "attention" || strings.Contains(u, "mla"):
		return GroupFullAttention
	case strings.Contains(u, "sliding") || strings.Contains(u, "chunked") || strings.Contains(u, "local"):
		return GroupSlidingWindow
	}
	return GroupState
}
