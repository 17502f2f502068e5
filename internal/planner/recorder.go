package planner

import (
	"context"
	"fmt"
	"math"
	"sync"
)

// Arrival is one request as routed: its sizes and, if it was rejected,
// which side rejected it.
type Arrival struct {
	At           float64 // clock seconds
	PromptTokens int
	CachedTokens int
	OutputTokens int // as planned: max_tokens, or the gateway's default
	// RejectedPrefill: predicted TTFT over its SLO; RejectedDecode: no KV
	// room or predicted TPOT over its SLO.
	RejectedPrefill bool
	RejectedDecode  bool
}

// Completion is one request's measured latencies when it finished.
type Completion struct {
	At       float64 // clock seconds of its last token
	TTFT     float64
	TPOT     float64
	TTFTMiss bool
	TPOTMiss bool
	// OutputTokens is how many tokens it was answered with (0: not
	// counted).
	OutputTokens int
	// Untimed: a non-streamed answer, whose output tokens count but
	// whose latencies were not measured (TTFT, TPOT and the misses
	// unset): it is no finished request of the window's.
	Untimed bool
}

// Recorder is a Source fed request by request (by a gateway, or a test's
// client): arrivals and completions, kept while they may fall in a window.
// It is safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	keep float64
	max  int
	arr  kept[Arrival]
	done kept[Completion]
}

// kept is a time-ordered queue of samples: old ones leave from the head,
// and the slice is compacted once the head passes half of it.
type kept[T any] struct {
	s    []T
	head int
}

// push appends x, drops samples older than oldest and the oldest beyond
// max.
func (k *kept[T]) push(x T, oldest float64, max int, at func(T) float64) {
	for k.head < len(k.s) && at(k.s[k.head]) < oldest {
		k.head++
	}
	if over := len(k.s) - k.head + 1 - max; over > 0 {
		k.head += over
	}
	if k.head > 1024 && k.head*2 > len(k.s) {
		n := copy(k.s, k.s[k.head:])
		clear(k.s[n:])
		k.s, k.head = k.s[:n], 0
	}
	k.s = append(k.s, x)
}

func (k *kept[T]) items() []T { return k.s[k.head:] }

// NewRecorder keeps samples for keep seconds (at least the planner's
// window), at most maxSamples of each kind (the oldest go first).
func NewRecorder(keep float64, maxSamples int) (*Recorder, error) {
	if !(keep > 0 && keep <= 86400) {
		return nil, fmt.Errorf("recorder: keep must be in (0, 86400] s, got %v", keep)
	}
	if maxSamples < 1 || maxSamples > 1<<24 {
		return nil, fmt.Errorf("recorder: max samples must be in [1, %d], got %d", 1<<24, maxSamples)
	}
	return &Recorder{keep: keep, max: maxSamples}, nil
}

// Arrived records a request's arrival.
func (r *Recorder) Arrived(a Arrival) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.arr.push(a, a.At-r.keep, r.max, func(x Arrival) float64 { return x.At })
}

// Completed records a request's completion.
func (r *Recorder) Completed(c Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done.push(c, c.At-r.keep, r.max, func(x Completion) float64 { return x.At })
}

// Observe implements Source over [now − window, now); it keeps no
// requests to replay (Observation.Recent stays nil).
func (r *Recorder) Observe(_ context.Context, now, window, _ float64) (Observation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	from := now - window
	o := Observation{Now: now, Window: window}
	for _, a := range r.arr.items() {
		if a.At < from || a.At >= now {
			continue
		}
		o.Requests++
		o.PromptTokens += int64(a.PromptTokens)
		o.CachedTokens += int64(min(a.CachedTokens, a.PromptTokens))
		o.OutputTokens += int64(a.OutputTokens)
		if a.RejectedPrefill {
			o.RejectedPrefill++
		} else if a.RejectedDecode {
			o.RejectedDecode++
		}
	}
	var ttft, tpot float64
	var counted, answered int64
	for _, c := range r.done.items() {
		if c.At < from || c.At >= now {
			continue
		}
		if c.OutputTokens > 0 {
			counted++
			answered += int64(c.OutputTokens)
		}
		if c.Untimed {
			continue
		}
		o.Finished++
		ttft += c.TTFT
		tpot += c.TPOT
		if c.TTFTMiss {
			o.TTFTMiss++
		}
		if c.TPOTMiss {
			o.TPOTMiss++
		}
	}
	if o.Finished > 0 {
		o.MeanTTFT, o.MeanTPOT = ttft/float64(o.Finished), tpot/float64(o.Finished)
	}
	if counted > 0 {
		// The output the answers had, not the max_tokens the requests
		// allowed (clients ask for 4 096 and get 300): each arrival
		// counts the mean of the answers counted in the window.
		o.OutputTokens = int64(math.Round(float64(answered) / float64(counted) * float64(o.Requests)))
	}
	return o, nil
}
