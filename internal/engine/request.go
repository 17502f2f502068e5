package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// Finish reasons as the OpenAI API reports them.
const (
	finishLength = "length"
	finishStop   = "stop"
	finishAbort  = "abort"
)

// request is one generation request inside the engine. The fields above mu
// are set before submission and then only read; the scheduler-owned block
// is touched only by the scheduler goroutine; out is shared with the HTTP
// handler under mu.
type request struct {
	id        string
	echo      requestEcho // a Responses API request's echo (responses.go)
	arrival   time.Time
	tokens    []uint32 // prompt followed by the outputs so far
	promptLen int
	maxTokens int
	// naturalEnd: the request ends by "EOS" after maxTokens (finish_reason
	// stop) rather than by hitting max_tokens (length).
	naturalEnd bool
	// continues: the answer continues text the request ends with (chat's
	// continue_final_message on a final message that ends in a word): its
	// first word comes after a space, as a real tokenizer's word token
	// after a word does (spaceBefore).
	continues bool
	seed      uint32
	// extra is mixed into the block hashes (setCacheKey): the LoRA
	// adapter's name, the cache salt.
	extra []byte
	// lora is the request's LoRA adapter: its vLLM lora_int_id (0: the
	// base model) and name.
	lora     int
	loraName string
	stream   bool
	// priority orders the waiting queue with Config.PriorityScheduling
	// (lower first); 0 otherwise.
	priority int

	// remotePrefill (decode side): the prompt's KV comes from a prefill
	// engine; remoteDecode (prefill side): keep the blocks for a decode
	// engine after answering.
	remotePrefill *remotePrefill
	remoteDecode  bool

	// Scheduler-owned.
	hashes       []uint64 // chained hashes of the full blocks of tokens
	blocks       []int32
	numComputed  int // tokens whose KV is in blocks
	storedBlocks int // leading blocks already in the prefix cache
	generated    int
	queried      bool // prefix cache hit recorded
	kvLoaded     bool // prompt KV received from a remote prefill
	transferred  bool // KV transfer started
	readyAt      time.Time
	scheduledAt  time.Time
	firstTokenAt time.Time
	lastTokenAt  time.Time

	aborted atomic.Bool
	notify  chan struct{} // capacity 1: coalesced "something changed"

	mu  sync.Mutex
	out requestOutput
}

// requestOutput is what the HTTP handler reads.
type requestOutput struct {
	generated    int
	cachedTokens int
	done         bool
	finishReason string
	kvParams     *kvTransferResponse
}

func (r *request) snapshot() requestOutput {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out
}

func (r *request) signal() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// decoding reports whether a step of n tokens for r is a decode step (one
// token after the prompt is in KV) rather than prefill work.
func (r *request) decoding(n int) bool {
	return n == 1 && (r.generated > 0 || r.kvLoaded)
}

// setCacheKey sets what, besides its tokens, keys the request's blocks:
// its LoRA adapter (lora > 0, named name) and its cache salt, as vLLM's
// block hashes mix in the adapter's name and the salt. Each part is
// tagged, so that no salt a client sends passes for an adapter.
func (r *request) setCacheKey(lora int, name, salt string) {
	r.extra = nil
	if lora > 0 {
		r.lora, r.loraName = lora, name
		r.extra = append(append(r.extra, "lora\x00"...), name...)
		r.extra = append(r.extra, 0)
	}
	if salt != "" {
		r.extra = append(append(r.extra, "salt\x00"...), salt...)
	}
}

// spaceBefore reports whether output word i of rq comes after a space:
// every word but the first, and the first of an answer that continues
// text.
func (rq *request) spaceBefore(i int) bool { return i > 0 || rq.continues }
