package gateway

import "sync"

// observed is what the gateway measured of an endpoint: an exponentially
// weighted mean of the time per output token of its streams.
type observed struct {
	mu      sync.Mutex
	tpotAvg float64
	n       int
}

const tpotWeight = 0.1

func (o *observed) addTPOT(v float64) {
	if v <= 0 || v > 60 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == 0 {
		o.tpotAvg = v
	} else {
		o.tpotAvg += tpotWeight * (v - o.tpotAvg)
	}
	o.n++
}

// tpot is the observed TPOT (0: unknown).
func (o *observed) tpot() float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tpotAvg
}

// shedder keeps class priorities apart within one model's fleet: when a
// request of priority p is rejected, every request of priority < p for
// the same model is rejected for shedWindow seconds, so no lower class is
// admitted while a higher one is turned away. Its own class is not shed:
// each of its requests is judged by its own prediction, as in the
// simulator (shedding it turned one rejection into a second's worth of
// them: 556 of 561 rejections in a demo run). Another model's fleet is
// another fleet: a rejection on one model once shed an idle model's
// requests too (a walkthrough of 2026-12-04: 8 of 15 turned away).
type shedder struct {
	mu    sync.Mutex
	until map[shedKey]float64 // clock time each shedding ends
}

type shedKey struct {
	model string
	prio  int
}

const shedWindow = 1.0

func (s *shedder) reject(model string, prio int, now float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[shedKey]float64{}
	}
	s.until[shedKey{model, prio}] = now + shedWindow
}

// shedding reports whether a request of model and priority prio must be
// rejected because one of a higher priority of the same model was
// rejected recently.
func (s *shedder) shedding(model string, prio int, now float64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, t := range s.until {
		if t <= now {
			delete(s.until, k)
			continue
		}
		if k.model == model && k.prio > prio {
			return true
		}
	}
	return false
}
