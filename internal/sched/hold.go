package sched

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/kvgate/kvgate/internal/fleet"
)

// Holding requests at the router (see docs/policies.md, "The hold queue").
//
// A request whose predicted TTFT misses its SLO on every endpoint is lost
// wherever it goes. Queued on an engine, it delays requests that can still
// make their SLO; parked behind an ever-growing queue, it starves. With
// Scheduler.Hold (and no early rejection) such a request is held at the
// router instead, in a HoldQueue, and released
//
//   - onto an endpoint with slack, by priority then age: an idle prefill
//     queue, where it delays no request already queued, or one where its
//     predicted TTFT from now is within HoldSlack × its SLO (the endpoint
//     keeps room for the requests that fit; typically the endpoint that
//     just took the previous turn of its conversation), the policy
//     choosing among those; once the oldest has waited longer than the
//     fleet takes to turn its caches over, the one of the oldest with the
//     most tokens cached where it would go first (cacheFirst); or
//   - when its age wins: at its deadline, arrival + max(HoldMin × SLO,
//     HoldBacklog × the fleet's backlog at its arrival), capped at
//     HoldMax. The backlog is
//     the mean predicted queue wait plus the compute already held, per
//     endpoint: what a fair FIFO fleet would have made it wait. An overdue
//     request goes, ahead of every request not yet overdue, where the
//     policy says (OverduePicker) or else to the endpoint that serves it
//     soonest.
//
// With early rejection, a request that fits nowhere only because of the
// load is rejected, but one that misses its SLO even on an idle endpoint
// (its prompt is too long for the SLO) would be rejected on any fleet
// state, every turn of its conversation: it would starve. It is held
// instead, released onto an idle endpoint of a mostly idle fleet (at
// least half its prefilling endpoints idle, holdIdleShare) that has
// rejected no request for the load for HoldQuiet SLOs (so its compute
// takes no room a request that can make its SLO needs), and rejected at
// its deadline, arrival + HoldMin SLOs, if that slack never came. Served,
// it warms the cache for its conversation's next turns, which then fit:
// the hold counts whether they come (Returns), stops serving such
// requests while few do, and serves them before the quiet window has
// passed while most do (lends).
//
// With HoldTouch (experimental, off by default), a touch pass after each
// release pass keeps held requests' cached prefixes warm with one-token
// requests once they are at risk (TouchHeld, touch.go).
//
// The simulator and the gateway both run this code: they push what Decide
// marks Hold (with the prompt's block keys), note rejections for the load
// (HoldQueue.NoteLoadRejection, RejectedForPrefill) and every arrival's
// block keys (HoldQueue.NoteArrival), and call Scheduler.ReleaseHeld
// whenever the fleet may have changed (a prefill ended, a request
// arrived, a deadline passed).

// Default hold parameters (Scheduler.HoldMin, HoldBacklog, HoldSlack,
// HoldMax).
const (
	DefaultHoldMin     = 1.0   // SLOs
	DefaultHoldBacklog = 1.0   // × the fleet's backlog
	DefaultHoldSlack   = 0.5   // SLOs
	DefaultHoldMax     = 600.0 // seconds
	DefaultHoldQuiet   = 30.0  // SLOs without a rejection for the load
)

// HoldMode says which policies a scheduler holds requests for.
type HoldMode int

const (
	// HoldByPolicy holds for the policies meant to (HoldsLost: kvgate's).
	HoldByPolicy HoldMode = iota
	// HoldAlways holds for every policy.
	HoldAlways
	// HoldNever holds for none.
	HoldNever
)

// ParseHoldMode reads a hold mode as kvgate sim's and kvgate serve's
// --hold take it: policy (HoldByPolicy), on (HoldAlways; all is read the
// same) or off (HoldNever).
func ParseHoldMode(s string) (HoldMode, error) {
	switch s {
	case "policy":
		return HoldByPolicy, nil
	case "on", "all":
		return HoldAlways, nil
	case "off":
		return HoldNever, nil
	}
	return 0, fmt.Errorf("must be policy, on or off, got %q", s)
}

// HoldSettings are a scheduler's hold settings as its caller configures
// them (kvgate sim's --hold-* flags, kvgate serve's hold: section): the
// mode and the Scheduler.Hold* parameters (0: the default).
type HoldSettings struct {
	Mode                            HoldMode
	Min, Backlog, Max, Slack, Quiet float64
	// Touch: Scheduler.HoldTouch.
	Touch bool
	// Displace says which policies displace (Scheduler.Displace, with
	// early rejection only): the policies meant to hold (HoldByPolicy:
	// kvgate's), every policy (HoldAlways) or none (HoldNever).
	Displace HoldMode
}

// Scheduler returns the scheduler of pol, with early rejection or not, that
// these settings ask for: the one place the settings become a Scheduler.
func (h HoldSettings) Scheduler(pol Policy, earlyReject bool) *Scheduler {
	return &Scheduler{Policy: pol, EarlyReject: earlyReject,
		Hold:    h.Mode == HoldAlways || (h.Mode == HoldByPolicy && HoldsLost(pol)),
		HoldMin: h.Min, HoldBacklog: h.Backlog, HoldMax: h.Max, HoldSlack: h.Slack, HoldQuiet: h.Quiet,
		HoldTouch: h.Touch,
		Displace:  earlyReject && (h.Displace == HoldAlways || (h.Displace == HoldByPolicy && HoldsLost(pol)))}
}

// ErrHoldFull is returned by HoldQueue.Push when the queue is at its cap.
var ErrHoldFull = errors.New("hold queue full")

// Held is one request held at the router.
type Held struct {
	Req Request
	// Until is the deadline (clock seconds): from then on its age wins.
	Until float64
	// Compute is its predicted compute time on the endpoint that would
	// compute the least (seconds), counted in the fleet's backlog while
	// held.
	Compute float64
	// Value is the caller's (the simulator's request index, the
	// gateway's waiting handler).
	Value any
	// Keys are the prompt's chained block keys, by which the hold
	// recognises a later request that extends it when it was served late
	// (Returns); nil when unknown.
	Keys []uint64
	// Tenant is whose request it is ("": none named; the gateway's
	// fairness header). Within a priority, the hold serves tenants in
	// turn by compute (fairTags).
	Tenant string

	touch    touchState // TouchHeld's, on its goroutine only
	seq      uint64
	tag      float64 // its fair start (fairTags; 0 before any tenant is named)
	prio, dl int     // heap positions; -1 when out
}

// HoldQueue is the router's queue of held requests, ordered two ways: by
// deadline, and by priority then arrival. It is safe for concurrent use.
type HoldQueue struct {
	mu         sync.Mutex
	byPrio     heldHeap
	byDL       heldHeap
	compute    float64
	seq        uint64
	cap        int
	rejections LoadRejections
	returns    Returns
	fair       fairTags
	// Touch passes' (touch.go): the turnover the last pass saw, and when
	// the head it saw would be at risk.
	turnover float64
	riskAt   float64
}

// LoadRejections remembers when the fleet last rejected a request for the
// load on the prefill side (RejectedForPrefill), in two kinds: while no
// prefilling endpoint stood idle (the fleet is short of compute: kvgate's
// pressure price, Snapshot.SinceLoadRejection) and while one did (the
// compute was there, but not where the request's prefix is cached:
// Snapshot.SinceIdleRejection). The hold queue's quiet window reads
// both. The zero value has seen none. It is safe for concurrent use.
type LoadRejections struct {
	mu               sync.Mutex
	short, misplaced stamp
}

// stamp is the clock time of the last event of a kind.
type stamp struct {
	at   float64 // clock seconds
	ever bool
}

func (t *stamp) note(now float64) {
	if !t.ever || now > t.at {
		t.at, t.ever = now, true
	}
}

// ago is how long before now the event was (+Inf if never).
func (t stamp) ago(now float64) float64 {
	if !t.ever {
		return math.Inf(1)
	}
	return now - t.at
}

// since is ago as a Snapshot field: at least a nanosecond, 0 if never.
func (t stamp) since(now float64) float64 {
	d := t.ago(now)
	if math.IsInf(d, 1) {
		return 0
	}
	return max(d, 1e-9)
}

// Note records a rejection for the load at clock time now; idle: a
// prefilling endpoint stood idle in the snapshot it was decided on
// (AnyPrefillIdle).
func (l *LoadRejections) Note(now float64, idle bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if idle {
		l.misplaced.note(now)
	} else {
		l.short.note(now)
	}
}

// quietFor is how long before now the last one of either kind was (+Inf
// if none).
func (l *LoadRejections) quietFor(now float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return min(l.short.ago(now), l.misplaced.ago(now))
}

// Fill sets s's SinceLoadRejection and SinceIdleRejection at s.Now.
func (l *LoadRejections) Fill(s *Snapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.SinceLoadRejection = l.short.since(s.Now)
	s.SinceIdleRejection = l.misplaced.since(s.Now)
}

// prefillIdle: e can prefill and has nothing queued to prefill.
func prefillIdle(e *Endpoint) bool { return e.Role.CanPrefill() && e.QueueWait <= 0 }

// AnyPrefillIdle reports whether some endpoint of s can prefill and has
// nothing queued to prefill (LoadRejections.Note's idle).
func AnyPrefillIdle(s *Snapshot) bool {
	for i := range s.Endpoints {
		if prefillIdle(&s.Endpoints[i]) {
			return true
		}
	}
	return false
}

// NewHoldQueue returns a queue holding at most capacity requests (> 0).
func NewHoldQueue(capacity int) *HoldQueue {
	q := &HoldQueue{cap: max(capacity, 1)}
	q.byPrio.less = func(a, b *Held) bool {
		if a.Req.Priority != b.Req.Priority {
			return a.Req.Priority > b.Req.Priority
		}
		if a.tag != b.tag {
			return a.tag < b.tag
		}
		if a.Req.Arrival != b.Req.Arrival {
			return a.Req.Arrival < b.Req.Arrival
		}
		return a.seq < b.seq
	}
	q.byPrio.pos = func(h *Held) *int { return &h.prio }
	q.byDL.less = func(a, b *Held) bool {
		if a.Until != b.Until {
			return a.Until < b.Until
		}
		return a.seq < b.seq
	}
	q.byDL.pos = func(h *Held) *int { return &h.dl }
	return q
}

// Len is the number of requests held.
func (q *HoldQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byPrio.h)
}

// Compute is the predicted compute held, in seconds (Snapshot.HeldCompute).
func (q *HoldQueue) Compute() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return max(q.compute, 0)
}

// NoteLoadRejection records that a request was rejected for the load at
// clock time now (see RejectedForPrefill, LoadRejections.Note): with
// early rejection, requests held because they miss their SLO even on an
// idle endpoint wait for a quiet fleet.
func (q *HoldQueue) NoteLoadRejection(now float64, idle bool) { q.rejections.Note(now, idle) }

// FillRejections is LoadRejections.Fill for the queue's fleet.
func (q *HoldQueue) FillRejections(s *Snapshot) { q.rejections.Fill(s) }

// quietFor is how long before now the last rejection for the load was
// (+Inf if none).
func (q *HoldQueue) quietFor(now float64) float64 { return q.rejections.quietFor(now) }

// NoteArrival tells the queue that a request with these chained block
// keys arrived at now: it settles the investments its prompt extends
// (Returns). The simulator and the gateway call it for every request.
func (q *HoldQueue) NoteArrival(now float64, keys []uint64) { q.returns.NoteArrival(now, keys) }

// ReturnsRate is the share of the requests the queue served late that
// came back, as of now (Returns.Rate).
func (q *HoldQueue) ReturnsRate(now float64) float64 { return q.returns.Rate(now) }

// NextDeadline is the earliest deadline held (+Inf when empty).
func (q *HoldQueue) NextDeadline() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.byDL.h) == 0 {
		return math.Inf(1)
	}
	return q.byDL.h[0].Until
}

// Push holds h; ErrHoldFull when the queue is at its cap. The queue owns h
// until it is removed or released.
func (q *HoldQueue) Push(h *Held) error {
	if h == nil || math.IsNaN(h.Until) || math.IsNaN(h.Compute) {
		return fmt.Errorf("hold: a held request needs a deadline and a compute time")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.byPrio.h) >= q.cap {
		return ErrHoldFull
	}
	q.seq++
	h.seq = q.seq
	h.tag = q.fair.start(h.Tenant, h.Req.Priority, h.Compute)
	heap.Push(&q.byPrio, h)
	heap.Push(&q.byDL, h)
	q.compute += h.Compute
	return nil
}

// Remove takes h out of the queue (its client left); false if it was not
// held (already released or removed).
func (q *HoldQueue) Remove(h *Held) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.remove(h)
}

func (q *HoldQueue) remove(h *Held) bool {
	if h == nil || h.prio < 0 || h.prio >= len(q.byPrio.h) || q.byPrio.h[h.prio] != h {
		return false // not held (heap.Remove leaves its positions at -1)
	}
	heap.Remove(&q.byPrio, h.prio)
	heap.Remove(&q.byDL, h.dl)
	q.compute -= h.Compute
	if len(q.byPrio.h) == 0 {
		q.compute = 0 // no drift from float sums
	}
	return true
}

// served advances the fair clock of h's priority past h, released
// (fairTags).
func (q *HoldQueue) served(h *Held) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.fair.served(h.Req.Priority, h.tag)
}

// maxFairTenants bounds the tenants the hold tracks apart (over all
// priorities); the rest share one turn.
const maxFairTenants = 4096

// fairTags orders held requests of one priority by tenant, start-time
// fair queueing by compute: a request's tag is where its tenant's turn
// starts, the later of its priority's clock (the tag of the last request
// of that priority served) and the end of the tenant's last request held
// at that priority (its tag plus its compute). A tenant that floods the
// hold queues behind its own requests, not behind everyone's, and a
// tenant that sends little is served at its turn: among the tenants of a
// priority each gets an equal share of the compute released, while every
// request's deadline still bounds its wait (overdue requests go first,
// by deadline). Until a request names a tenant every tag is 0: the order
// is by arrival, as it always was (the simulator's; a gateway without
// tenants).
type fairTags struct {
	named   bool
	bands   map[int]*fairBand
	tenants int // entries in all bands' ends
}

// fairBand is one priority's turns.
type fairBand struct {
	clock float64
	ends  map[string]float64 // a tenant's last request's end
}

// start tags a request of tenant at priority computing compute seconds.
func (f *fairTags) start(tenant string, priority int, compute float64) float64 {
	f.named = f.named || tenant != ""
	if !f.named {
		return 0
	}
	if f.bands == nil {
		f.bands = map[int]*fairBand{}
	}
	b := f.bands[priority]
	if b == nil {
		b = &fairBand{ends: map[string]float64{}}
		f.bands[priority] = b
	}
	if _, ok := b.ends[tenant]; !ok {
		if f.tenants >= maxFairTenants {
			f.prune()
		}
		if f.tenants >= maxFairTenants {
			tenant = "\x00others"
		}
		if _, ok := b.ends[tenant]; !ok {
			f.tenants++
		}
	}
	tag := max(b.clock, b.ends[tenant])
	b.ends[tenant] = tag + max(compute, 1e-3)
	return tag
}

// served moves priority's clock to a served request's tag.
func (f *fairTags) served(priority int, tag float64) {
	if b := f.bands[priority]; b != nil {
		b.clock = max(b.clock, tag)
	}
}

// prune forgets the tenants whose last request ended before their
// priority's clock (their next request starts at the clock anyway), and
// the priorities left without any.
func (f *fairTags) prune() {
	for p, b := range f.bands {
		for t, end := range b.ends {
			if end <= b.clock {
				delete(b.ends, t)
				f.tenants--
			}
		}
		if len(b.ends) == 0 {
			delete(f.bands, p)
		}
	}
}

// peek returns the request to consider next at now: the overdue one with
// the earliest deadline if any (overdue true), else the first by priority
// then arrival.
func (q *HoldQueue) peek(now float64) (*Held, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.byDL.h) == 0 {
		return nil, false
	}
	if h := q.byDL.h[0]; h.Until <= now {
		return h, true
	}
	return q.byPrio.h[0], false
}

// oldest appends to dst the first k held requests by priority then
// arrival, in that order: a best-first walk down the priority heap, whose
// frontier (itself a heap) never holds more than k+1 entries.
func (q *HoldQueue) oldest(k int, dst []*Held) []*Held {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.byPrio.h
	if len(h) == 0 || k <= 0 {
		return dst
	}
	f := &frontier{at: make([]int, 1, min(k+1, len(h))), h: h, less: q.byPrio.less}
	for f.Len() > 0 && k > 0 {
		i := heap.Pop(f).(int)
		dst = append(dst, h[i])
		k--
		for c := 2*i + 1; c <= 2*i+2 && c < len(h); c++ {
			heap.Push(f, c)
		}
	}
	return dst
}

// frontier is oldest's walk: positions in a held heap h, as a heap under
// less.
type frontier struct {
	at   []int
	h    []*Held
	less func(a, b *Held) bool
}

func (f *frontier) Len() int           { return len(f.at) }
func (f *frontier) Less(i, j int) bool { return f.less(f.h[f.at[i]], f.h[f.at[j]]) }
func (f *frontier) Swap(i, j int)      { f.at[i], f.at[j] = f.at[j], f.at[i] }
func (f *frontier) Push(x any)         { f.at = append(f.at, x.(int)) }
func (f *frontier) Pop() any {
	n := len(f.at) - 1
	x := f.at[n]
	f.at = f.at[:n]
	return x
}

// heldHeap is a binary heap of held requests under less, keeping each
// one's position in the field pos returns.
type heldHeap struct {
	h    []*Held
	less func(a, b *Held) bool
	pos  func(*Held) *int
}

func (h *heldHeap) Len() int           { return len(h.h) }
func (h *heldHeap) Less(i, j int) bool { return h.less(h.h[i], h.h[j]) }
func (h *heldHeap) Swap(i, j int) {
	h.h[i], h.h[j] = h.h[j], h.h[i]
	*h.pos(h.h[i]) = i
	*h.pos(h.h[j]) = j
}
func (h *heldHeap) Push(x any) {
	e := x.(*Held)
	*h.pos(e) = len(h.h)
	h.h = append(h.h, e)
}
func (h *heldHeap) Pop() any {
	n := len(h.h) - 1
	e := h.h[n]
	h.h[n] = nil
	h.h = h.h[:n]
	*h.pos(e) = -1
	return e
}

// HoldFleet is what a release pass needs of its caller.
type HoldFleet interface {
	// SnapshotFor fills s with the fleet as seen at now, the pass's
	// time, for h's request (its cached prefix on each endpoint,
	// Snapshot.HeldCompute). One pass compares its held requests on
	// snapshots of one instant: on a clock read per snapshot, a request
	// looked at later could find slack an older one was refused a moment
	// before, and go first.
	SnapshotFor(h *Held, now float64, s *Snapshot)
	// Dispatch sends h's request where d says, or, with d.Admit false
	// (early rejection: no slack came before its deadline), rejects it
	// with d.Reason. h is out of the queue by then.
	Dispatch(h *Held, d Decision)
}

// ReleaseHeld runs one release pass at clock time now: overdue requests
// first, each to the endpoint that serves it soonest; then, while an
// endpoint has slack, the next request by priority and age. It returns how
// many it released. s is scratch for the snapshots.
func (sc *Scheduler) ReleaseHeld(q *HoldQueue, now float64, f HoldFleet, s *Snapshot) int {
	n := 0
	for {
		h, overdue := q.peek(now)
		if h == nil {
			return n
		}
		f.SnapshotFor(h, now, s)
		if !overdue && !sc.EarlyReject && cachesAtRisk(h, now, s) {
			h = sc.cacheFirst(q, h, now, f, s)
			f.SnapshotFor(h, now, s)
		}
		l := lending{quiet: q.quietFor(now)}
		if sc.EarlyReject && !overdue {
			l.returns = q.returns.Rate(now) // read only to lend
		}
		d, ok := sc.release(&h.Req, s, overdue, l)
		if !ok {
			return n
		}
		if !q.Remove(h) {
			continue // removed meanwhile (its client left)
		}
		q.served(h)
		if sc.EarlyReject && !overdue && d.Admit {
			// Served late, for what it leaves in the cache.
			q.returns.Invest(now, h.Keys, sc.quietWindow(&h.Req))
			d.Invests = true
		}
		f.Dispatch(h, d)
		n++
	}
}

// cacheFirstCandidates is how many of the oldest held requests a release
// pass weighs against each other once their caches are at risk
// (cacheFirst): each costs a snapshot and a pick. docs/policies.md has
// what more would gain and cost.
const cacheFirstCandidates = 64

// cacheFirst is the held request a release on slack (without early
// rejection) serves next once the held requests' caches are at risk
// (cachesAtRisk) in the pass at now, head being the first by priority then
// arrival; s holds the head's snapshot and is scratch after.
//
// A held request has missed its SLO; the order the hold serves such
// requests in moves little attainment, but it decides how much of their
// prompts is still cached when they are served. Endpoints evict least
// recently used blocks first, so a held request's cached prefix is gone
// once its endpoint has computed about as many new tokens as its cache
// holds, whoever they were for. While the head has waited less than that
// turnover (turnover), nothing held is at risk yet and the hold serves in
// order. Once it has waited longer, the hold serves first, among the
// cacheFirstCandidates oldest of the head's priority, the one with the
// most tokens cached where it would be released (the policy's pick among
// the endpoints with slack; ties to the older): what it saves is compute
// the backlog no longer holds, and a request whose prefix is cached
// nowhere loses nothing by waiting. Every request's deadline still bounds
// its wait: overdue requests go first, in deadline order (peek).
func (sc *Scheduler) cacheFirst(q *HoldQueue, head *Held, now float64, f HoldFleet, s *Snapshot) *Held {
	best, most := head, -1
	for _, c := range q.oldest(cacheFirstCandidates, make([]*Held, 0, cacheFirstCandidates)) {
		if c.Req.Priority != head.Req.Priority {
			break
		}
		if c != head {
			f.SnapshotFor(c, now, s) // s holds the head's already
		}
		if i := sc.pickWithSlack(&c.Req, s); i >= 0 && s.Endpoints[i].CachedTokens > most {
			best, most = c, s.Endpoints[i].CachedTokens
		}
	}
	return best
}

// cachesAtRisk: the first held request, head, has waited at now longer
// than the turnover of the fleet s shows (cacheFirst).
func cachesAtRisk(head *Held, now float64, s *Snapshot) bool {
	t := turnover(s)
	return t > 0 && now-head.Req.Arrival > t
}

// turnover is how long the prefilling endpoints of s take to compute as
// many tokens as their caches hold (Endpoint.HeldTokens over their summed
// prefill speed; seconds, 0 when either is unknown): about when a block
// no request uses again is evicted from a full cache.
func turnover(s *Snapshot) float64 {
	var held, speed float64
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Role.CanPrefill() && e.PrefillSpeed > 0 {
			held += float64(max(e.HeldTokens, 0))
			speed += e.PrefillSpeed
		}
	}
	if speed <= 0 || math.IsInf(speed, 1) {
		return 0
	}
	return held / speed
}

// release decides a held request at s.Now: overdue, where the policy says
// (with early rejection: rejected); else, if any endpoint has slack (an
// idle queue, or a predicted TTFT within HoldSlack SLOs; with early
// rejection, an idle queue in a fleet that lends the compute, l), on the
// one the policy picks among those.
func (sc *Scheduler) release(in *Request, s *Snapshot, overdue bool, l lending) (Decision, bool) {
	req := *in
	req.SLO = sc.WithDefaults(req.SLO)
	d := Decision{Prefill: -1, Decode: -1, SLO: req.SLO, Reason: "released from hold (deadline)"}
	best := -1
	switch {
	case overdue && sc.EarlyReject:
		d.Reason = fmt.Sprintf("%s, and the fleet did not lend it one before its deadline (it lends one while no request was rejected for the load lately and at least half its prefill endpoints are idle, another kept for arrivals)", idleMiss(&req, s))
		return d, true
	case overdue:
		best = sc.pickOverdue(&req, s)
	case sc.EarlyReject:
		d.Reason = "released from hold (idle endpoint, quiet fleet)"
		if sc.lends(&req, s, l) {
			best = sc.pickIdle(&req, s)
		}
	default:
		d.Reason = "released from hold (slack)"
		best = sc.pickWithSlack(&req, s)
	}
	if best < 0 {
		return d, false
	}
	pe := &s.Endpoints[best]
	d.Admit, d.Prefill, d.CachedTokens = true, best, pe.CachedTokens
	d.PredictedTTFT = PredictTTFT(&req, pe)
	if pe.Role == fleet.RolePrefill {
		var de DecodeView
		d.Decode, de = PickDecode(&req, s, s.Now+d.PredictedTTFT)
		if d.Decode < 0 {
			d.Admit, d.Reason = false, "no decode endpoint"
			return d, false
		}
		d.PredictedTPOT = de.TPOT
	}
	return d, true
}

// lending is what the fleet's recent past says about serving late a
// request that misses its SLO even alone (with early rejection).
type lending struct {
	// quiet is how long ago the last rejection for the load was
	// (seconds; +Inf: none yet).
	quiet float64
	// returns is the share of such requests served late whose prompt a
	// later request extended (Returns.Rate).
	returns float64
}

// Shares of the hold's investments that came back (Returns.Rate) below
// which it stops investing (returnsKeep), and above which it lends beyond
// the quiet window (returnsLend): while most came back, the compute a
// late prompt takes comes back as its conversation's next turns.
const (
	returnsKeep = 0.25
	returnsLend = 0.5
)

// quietWindow is HoldQuiet SLOs of req, in seconds.
func (sc *Scheduler) quietWindow(req *Request) float64 {
	return orDefault(sc.HoldQuiet, DefaultHoldQuiet) * sc.WithDefaults(req.SLO).TTFT
}

// lends reports whether the fleet lends req, which misses its SLO even
// alone, the compute to serve it late (on an idle endpoint of a mostly
// idle fleet: pickIdle): while at least returnsKeep of such requests came
// back, once no request has been rejected for the load for the quiet
// window; and, while most came back (returnsLend), before that, by as
// many SLOs of overshoot (its TTFT alone beyond the SLO) as the share of
// the window that has passed (one SLO at the full window).
func (sc *Scheduler) lends(req *Request, s *Snapshot, l lending) bool {
	if l.returns < returnsKeep {
		return false
	}
	window := sc.quietWindow(req)
	if l.quiet >= window {
		return true
	}
	if l.returns <= returnsLend || !(l.quiet > 0) {
		return false
	}
	return overshoot(req, s) <= l.quiet/window*req.SLO.TTFT
}

// overshoot is how far req's TTFT alone, on the prefilling endpoint where
// it is shortest, exceeds its SLO (seconds; +Inf: no endpoint prefills).
func overshoot(req *Request, s *Snapshot) float64 {
	least := math.Inf(1)
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Role.CanPrefill() {
			least = min(least, aloneTTFT(req, e))
		}
	}
	return least - req.SLO.TTFT
}

// OverduePicker is a policy that chooses where its overdue held requests
// go (kvgate prices the compute they take); without it they go to the
// endpoint that serves them soonest. PickOverdue gets only endpoints that
// can prefill and returns an index into s.Endpoints (-1: none).
type OverduePicker interface {
	PickOverdue(req *Request, s *Snapshot) int
}

// pickOverdue is where an overdue held request goes.
func (sc *Scheduler) pickOverdue(req *Request, s *Snapshot) int {
	op, ok := sc.Policy.(OverduePicker)
	if !ok {
		return soonest(req, s)
	}
	return sc.pickAmong(s, func(e *Endpoint) bool { return e.Role.CanPrefill() },
		func(cand *Snapshot) int { return op.PickOverdue(req, cand) })
}

// soonest is the prefilling endpoint with the lowest predicted TTFT (-1:
// none).
func soonest(req *Request, s *Snapshot) int {
	best, bt := -1, math.Inf(1)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Role.CanPrefill() {
			continue
		}
		if t := PredictTTFT(req, e); best < 0 || t < bt || (t == bt && tieBetter(s, i, best)) {
			best, bt = i, t
		}
	}
	return best
}

// pickWithSlack is the policy's pick among the endpoints with slack for
// req (-1: none has).
func (sc *Scheduler) pickWithSlack(req *Request, s *Snapshot) int {
	slack := orDefault(sc.HoldSlack, DefaultHoldSlack)
	return sc.pickAmong(s, func(e *Endpoint) bool {
		return e.Role.CanPrefill() && (e.QueueWait <= 0 || PredictTTFT(req, e) <= slack*req.SLO.TTFT)
	}, func(cand *Snapshot) int { return sc.Policy.Pick(req, cand) })
}

// holdIdleShare is the share of a fleet's prefilling endpoints that must
// be idle before one takes a held request that misses its SLO even alone
// (with early rejection): that request is a miss wherever it runs, and its
// prefill takes an instance out of service for seconds, so it runs only
// on a mostly idle fleet. The quiet window says the fleet has not been
// short of compute lately; this says it is not busy now (a burst, or a
// flood whose first rejection has not come yet, as at a run's start).
const holdIdleShare = 0.5

// pickIdle is the policy's pick among the idle prefilling endpoints, if
// at least two are idle (the fleet keeps one for what arrives next; a
// fleet of one prefilling endpoint, its only one) and at least
// holdIdleShare of them; -1 otherwise. A fleet of one has no endpoint to
// keep: required idle too, it never served such a request, rejecting
// every one on an idle engine (long prompts on one instance, rejection
// on, seeds 0-4, 20 minutes: attainment within 0.1 point at 0.3-1.5x
// load, rejected 10.6 -> 8.8 % at 0.3x).
func (sc *Scheduler) pickIdle(req *Request, s *Snapshot) int {
	idle := prefillIdle
	n, all := 0, 0
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Role.CanPrefill() {
			all++
			if idle(e) {
				n++
			}
		}
	}
	if n < min(2, all) || float64(n) < holdIdleShare*float64(all) {
		return -1
	}
	return sc.pickAmong(s, idle, func(cand *Snapshot) int { return sc.Policy.Pick(req, cand) })
}

// pickAmong runs pick on the endpoints of s that keep keeps and maps its
// answer back to an index into s (-1: none kept, or pick declined).
func (sc *Scheduler) pickAmong(s *Snapshot, keep func(*Endpoint) bool, pick func(*Snapshot) int) int {
	v, _ := sc.scratch.Get().(*view)
	if v == nil {
		v = &view{}
	}
	defer sc.scratch.Put(v)
	cand := candidates(s, v, keep)
	if len(cand.Endpoints) == 0 {
		return -1
	}
	p := pick(cand)
	if p < 0 || p >= len(cand.Endpoints) {
		return -1
	}
	if v.index != nil {
		p = v.index[p]
	}
	return p
}

// aloneTTFT is req's pessimistic TTFT on e with an empty queue.
func aloneTTFT(req *Request, e *Endpoint) float64 {
	return computeSeconds(req, e) * max(e.PrefillSlack, 1)
}

// RejectedForLoad reports whether d, decided by Decide for req on s,
// rejected req because of the load: the request fits its TTFT SLO on the
// chosen endpoint with an empty queue (or has none), or was rejected on
// the decode side. The gateway sheds a class only for such rejections;
// the prefill-side ones (RejectedForPrefill) are noted in LoadRejections.
func RejectedForLoad(req *Request, s *Snapshot, d *Decision) bool {
	if d.Admit || d.Hold || d.Prefill < 0 || d.Prefill >= len(s.Endpoints) {
		return false
	}
	return d.SLO.TTFT <= 0 || aloneTTFT(req, &s.Endpoints[d.Prefill]) <= d.SLO.TTFT
}

// RejectedForPrefill reports whether d rejected req because the chosen
// prefill endpoint's queue pushed its TTFT over the SLO, which alone it
// would fit: the fleet is short of prefill compute. (A rejection on the
// decode side is for the load too, but says nothing of prefill compute.)
// Callers note these in their LoadRejections: the hold's quiet window and
// kvgate's pressure price read them.
func RejectedForPrefill(req *Request, s *Snapshot, d *Decision) bool {
	if !RejectedForLoad(req, s, d) || d.SLO.TTFT <= 0 {
		return false
	}
	return PessimisticTTFT(req, &s.Endpoints[d.Prefill]) > d.SLO.TTFT
}

// orDefault is v, or d when v is not set (<= 0).
func orDefault(v, d float64) float64 {
	if v <= 0 {
		return d
	}
	return v
}

// hold marks d as held, req fitting its SLO nowhere (fitsSomewhere; with
// early rejection: not even with an empty queue): its deadline and the
// compute it adds to the backlog.
func (sc *Scheduler) hold(req *Request, cand *Snapshot, d *Decision) {
	minTTFT, minCompute := math.Inf(1), math.Inf(1)
	for i := range cand.Endpoints {
		e := &cand.Endpoints[i]
		minTTFT = min(minTTFT, PredictTTFT(req, e))
		if e.PrefillSpeed > 0 {
			minCompute = min(minCompute, computeSeconds(req, e))
		}
	}
	wait := min(sc.holdWait(req, cand), orDefault(sc.HoldMax, DefaultHoldMax))
	d.Admit, d.Hold = false, true
	d.HoldUntil = req.Arrival + wait
	if math.IsInf(minCompute, 1) {
		minCompute = 0
	}
	d.HoldCompute = minCompute
	d.PredictedTTFT = minTTFT
	d.Reason = fmt.Sprintf("held: predicted TTFT %.3fs misses SLO %.3fs on every endpoint; released on slack or at +%.1fs", minTTFT, req.SLO.TTFT, wait)
	if sc.EarlyReject {
		d.Reason = fmt.Sprintf("held: %s; served on an idle endpoint of a quiet fleet or rejected at +%.1fs", idleMiss(req, cand), wait)
	}
}

// keepWarm is the candidate a request that fits its SLO nowhere is served
// on at once instead of being held, without early rejection (-1: none):
// one that holds at least half its prompt cached, where its TTFT is
// least, when computed whole the prompt would miss the SLO even on that
// endpoint idle. Such a request's cache is what keeps its conversation
// servable at all: held, it waits while other conversations evict it,
// and then it and every later turn of its conversation miss (coding-agent
// sessions grown to tens of thousands of tokens: 23 % held and all late
// at 0.7× load; docs/policies.md, "Lost requests kept warm"). A request
// whose whole prompt fits the SLO loses little with its cache and is held
// as before: served at once it would push requests that can still make
// their SLO past it.
func (sc *Scheduler) keepWarm(req *Request, cand *Snapshot) int {
	if sc.EarlyReject {
		return -1
	}
	best, bt := -1, math.Inf(1)
	for i := range cand.Endpoints {
		e := &cand.Endpoints[i]
		if e.PrefillSpeed <= 0 || 2*Uncached(req, e) > req.PromptTokens || float64(req.PromptTokens)/e.PrefillSpeed <= req.SLO.TTFT {
			continue
		}
		if t := PredictTTFT(req, e); t < bt {
			best, bt = i, t
		}
	}
	return best
}

// idleMiss says by how much req misses its TTFT SLO even on the best
// idle endpoint of s: the pessimistic TTFT admission judges it by, and
// the predicted one beside it (the rejection named no number, and said
// "predicted" where only the pessimistic one missed).
func idleMiss(req *Request, s *Snapshot) string {
	pess, pred := math.Inf(1), math.Inf(1)
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Role.CanPrefill() && e.PrefillSpeed > 0 {
			pess, pred = min(pess, aloneTTFT(req, e)), min(pred, computeSeconds(req, e))
		}
	}
	if math.IsInf(pess, 1) {
		return fmt.Sprintf("TTFT misses SLO %.3fs even on an idle endpoint", req.SLO.TTFT)
	}
	return fmt.Sprintf("TTFT even on an idle endpoint %.3fs (pessimistic; predicted %.3fs) misses SLO %.3fs", pess, pred, req.SLO.TTFT)
}

// fitsSomewhere reports whether req's predicted TTFT fits its SLO on a
// candidate (the common case: the check ends at the first that fits);
// with early rejection, whether it would fit with an empty queue (then it
// fits, or misses for the load, and admission decides).
func (sc *Scheduler) fitsSomewhere(req *Request, cand *Snapshot) bool {
	for i := range cand.Endpoints {
		e := &cand.Endpoints[i]
		t := PredictTTFT(req, e)
		if sc.EarlyReject {
			t = aloneTTFT(req, e)
		}
		if t <= req.SLO.TTFT {
			return true
		}
	}
	return false
}

// holdWait is how long after its arrival a held request's age wins (before
// HoldMax): with early rejection HoldMin SLOs (it gets its answer soon,
// served on slack or rejected); without, at least that and HoldBacklog ×
// the fleet's backlog (mean queue wait plus held compute per endpoint).
func (sc *Scheduler) holdWait(req *Request, cand *Snapshot) float64 {
	least := orDefault(sc.HoldMin, DefaultHoldMin) * req.SLO.TTFT
	if sc.EarlyReject {
		return least
	}
	var queued float64
	for i := range cand.Endpoints {
		queued += cand.Endpoints[i].QueueWait
	}
	n := float64(len(cand.Endpoints))
	backlog := queued/n + max(cand.HeldCompute, 0)/n
	return max(least, orDefault(sc.HoldBacklog, DefaultHoldBacklog)*backlog)
}
