package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
)

// Config tunes a Planner. Zero values take the defaults (Defaults).
type Config struct {
	// Total is the instance budget; 0: every instance the actuator
	// reports.
	Total int
	// MinPrefill and MinDecode are the fewest instances of each role
	// (default 1).
	MinPrefill, MinDecode int
	// Capacity estimates per-instance capacity (default: the seed's
	// 20 000 / 3 000 tokens/s).
	Capacity CapacityEstimator
	// Learn corrects the capacity estimate from measured SLO misses.
	Learn bool
	// PrefillUtil is the prefill utilisation above which the planner
	// expects misses (default 0.95): early rejection sheds the excess, so
	// at utilisation u a share 1 − PrefillUtil/u of the requests miss.
	PrefillUtil float64
	// DecodeUtil is the decode utilisation above which the planner
	// expects misses (default 0.95), and DecodeSlack how much further the
	// misses take to reach every request (default 0.2): past capacity the
	// TPOT of every stream on an instance degrades, so the share missing
	// is min(1, (u − DecodeUtil) / DecodeSlack).
	DecodeUtil  float64
	DecodeSlack float64
	// Band is the hysteresis band (default 0.1): the current split is
	// kept while it meets its targets (PrefillUtil, DecodeUtil) at the
	// smoothed load, and a new split is chosen for a load Band above the
	// forecast, so that it starts with that much headroom and the noise
	// that made it necessary does not undo it. The forecast itself may
	// run at most Band above the latest window or the level.
	Band float64
	// Margin is the least predicted gain in SLO attainment (a share of
	// requests) that justifies a change (default 0.02).
	Margin float64
	// Confirm is how many consecutive decisions must propose the same
	// direction before the planner acts (default 2), unless the current
	// split already misses for at least a share BigGain of the requests at
	// the smoothed load (default 0.2): a step change, not noise; or the
	// what-if simulation chose the split (it replayed minutes of traffic).
	Confirm int
	BigGain float64
	// Cooldown is the fewest seconds from the start of one change to the
	// start of the next (default 60); a change is never started while
	// another is in flight.
	Cooldown float64
	// AbsorbMax is the highest utilisation the side giving up instances
	// may be left with (default 0.9), unless it stays below the side it
	// helps.
	AbsorbMax float64
	// Horizon is how long, in seconds, a new split is expected to pay off
	// (default 600): a switch must gain more over it than the switch
	// costs while its instances drain and warm up.
	Horizon float64
	// Warmup is the seconds an instance needs after draining (default 30).
	Warmup float64
	// Interval is the seconds between decisions (default 30); the
	// forecast looks Interval + Warmup ahead.
	Interval float64
	// MaxStep caps the instances moved by one change (0: no cap).
	MaxStep int
	// Alpha and Beta smooth the load's level and trend (defaults 0.5 and
	// 0.3).
	Alpha, Beta float64
	// MinWindows is how many observations the planner waits for before
	// its first decision (default 2).
	MinWindows int
	// WhatIf, when set, simulates the candidate splits on the recent
	// traffic and picks by simulated SLO attainment.
	WhatIf *WhatIf
	// History is how many decisions Status keeps (default 256).
	History int
	Logger  *slog.Logger
}

// ConfigLimits are the ranges of a Config's numbers (0 takes the default).
type ConfigLimits struct {
	Total, MinInstances, Confirm, MaxStep, MinWindows, History flagrange.Range[int]
	PrefillUtil, DecodeUtil, DecodeSlack                       flagrange.Range[float64]
	Band, Margin, BigGain, AbsorbMax, Alpha, Beta              flagrange.Range[float64]
	Cooldown, Horizon, Warmup, Interval                        flagrange.Range[float64]
}

// Limits returns the ranges Validate enforces; kvgate plan's flags use them.
func Limits() ConfigLimits {
	sec := func(lo, hi float64) flagrange.Range[float64] {
		return flagrange.Range[float64]{Min: lo, Max: hi, Unit: "seconds", Zero: "default"}
	}
	frac := func(lo, hi float64) flagrange.Range[float64] {
		return flagrange.Range[float64]{Min: lo, Max: hi, Zero: "default"}
	}
	return ConfigLimits{
		Total:        flagrange.Range[int]{Min: 2, Max: 100000, Unit: "instances", Zero: "the fleet's size"},
		MinInstances: flagrange.Range[int]{Min: 1, Max: 100000, Unit: "instances", Zero: "1"},
		Confirm:      flagrange.Range[int]{Min: 1, Max: 100, Unit: "decisions", Zero: "2"},
		MaxStep:      flagrange.Range[int]{Min: 1, Max: 100000, Unit: "instances", Zero: "no cap"},
		MinWindows:   flagrange.Range[int]{Min: 1, Max: 1000, Zero: "2"},
		History:      flagrange.Range[int]{Min: 1, Max: 100000, Zero: "256"},
		PrefillUtil:  frac(0.1, 1),
		DecodeUtil:   frac(0.1, 1),
		DecodeSlack:  frac(0.01, 10),
		Band:         frac(0.001, 1),
		Margin:       frac(0.0001, 1),
		BigGain:      frac(0.0001, 1),
		AbsorbMax:    frac(0.1, 1),
		Alpha:        frac(0.01, 1),
		Beta:         frac(0.01, 1),
		Cooldown:     sec(0.001, 86400),
		Horizon:      sec(1, 7*86400),
		Warmup:       sec(0.001, 3600),
		Interval:     sec(0.001, 86400),
	}
}

// Validate checks the numbers against Limits.
func (c *Config) Validate() error {
	l := Limits()
	err := errors.Join(
		l.Total.Check("total", c.Total),
		l.MinInstances.Check("min-prefill", c.MinPrefill),
		l.MinInstances.Check("min-decode", c.MinDecode),
		l.Confirm.Check("confirm", c.Confirm),
		l.MaxStep.Check("max-step", c.MaxStep),
		l.MinWindows.Check("min-windows", c.MinWindows),
		l.History.Check("history", c.History),
		l.PrefillUtil.Check("prefill-util", c.PrefillUtil),
		l.DecodeUtil.Check("decode-util", c.DecodeUtil),
		l.DecodeSlack.Check("decode-slack", c.DecodeSlack),
		l.Band.Check("band", c.Band),
		l.Margin.Check("margin", c.Margin),
		l.BigGain.Check("big-gain", c.BigGain),
		l.AbsorbMax.Check("absorb-max", c.AbsorbMax),
		l.Alpha.Check("alpha", c.Alpha),
		l.Beta.Check("beta", c.Beta),
		l.Cooldown.Check("cooldown", c.Cooldown),
		l.Horizon.Check("horizon", c.Horizon),
		l.Warmup.Check("warmup", c.Warmup),
		l.Interval.Check("interval", c.Interval),
	)
	if err == nil && c.Total > 0 && c.MinPrefill+c.MinDecode > c.Total {
		err = fmt.Errorf("min-prefill + min-decode = %d exceeds total %d", c.MinPrefill+c.MinDecode, c.Total)
	}
	if err != nil {
		return fmt.Errorf("planner: %w", err)
	}
	return nil
}

// withDefaults fills the zero values.
func (c Config) withDefaults() Config {
	defI := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defF := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defI(&c.MinPrefill, 1)
	defI(&c.MinDecode, 1)
	defI(&c.Confirm, 2)
	defI(&c.MinWindows, 2)
	defI(&c.History, 256)
	defF(&c.PrefillUtil, 0.95)
	defF(&c.DecodeUtil, 0.95)
	defF(&c.DecodeSlack, 0.2)
	defF(&c.Band, 0.1)
	defF(&c.Margin, 0.02)
	defF(&c.BigGain, 0.2)
	defF(&c.Cooldown, 60)
	defF(&c.AbsorbMax, 0.9)
	defF(&c.Horizon, 600)
	defF(&c.Warmup, 30)
	defF(&c.Interval, 30)
	defF(&c.Alpha, 0.5)
	defF(&c.Beta, 0.3)
	if c.Capacity == nil {
		c.Capacity = StaticCapacity(SeedCapacity())
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Decision actions.
const (
	ActionSwitch = "switch" // a change starts
	ActionHold   = "hold"   // the split stays
	ActionWait   = "wait"   // a change is in flight or the planner is still observing
)

// Decision is one planning step and why.
type Decision struct {
	At     float64 `json:"at"`
	Action string  `json:"action"`
	Reason string  `json:"reason"`
	// Prefill and Decode are the serving instances; Switching those
	// changing role.
	Prefill   int `json:"prefill"`
	Decode    int `json:"decode"`
	Switching int `json:"switching"`
	// TargetPrefill and TargetDecode are the split the planner wants.
	TargetPrefill int `json:"target_prefill"`
	TargetDecode  int `json:"target_decode"`
	// ToPrefill and ToDecode name the instances a switch moves.
	ToPrefill []string `json:"to_prefill,omitempty"`
	ToDecode  []string `json:"to_decode,omitempty"`
	// Shape is the observed shape; PrefillLoad and DecodeLoad the
	// forecast loads (tokens/s) the split is sized for.
	Shape       Shape    `json:"shape"`
	PrefillLoad float64  `json:"prefill_load"`
	DecodeLoad  float64  `json:"decode_load"`
	Capacity    Capacity `json:"capacity"`
	// PrefillUtil and DecodeUtil are the current split's forecast
	// utilisation.
	PrefillUtil float64 `json:"prefill_util"`
	DecodeUtil  float64 `json:"decode_util"`
	// Gain is the predicted attainment gain of the change, SwitchSeconds
	// its expected drain plus warm-up.
	Gain          float64 `json:"gain,omitempty"`
	SwitchSeconds float64 `json:"switch_seconds,omitempty"`
	// WhatIf lists the simulated candidates, when the planner simulated.
	WhatIf []Candidate `json:"what_if,omitempty"`
}

// Planner decides the prefill/decode split. It is used by one goroutine at
// a time (Loop serialises its calls).
type Planner struct {
	cfg   Config
	log   *slog.Logger
	fc    forecaster
	learn learned

	coolUntil  float64 // no change before this time (the last start + Cooldown)
	pendingDir int     // direction of the last proposed change (+1: more prefill)
	pendingN   int     // consecutive proposals in that direction
	lastWhatIf float64
	// cannot is why the planner last could not plan the fleet at all
	// (logged once a reason).
	cannot string
}

// New returns a planner; cfg is validated and its zero values defaulted.
func New(cfg Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.WhatIf != nil {
		if err := cfg.WhatIf.validate(); err != nil {
			return nil, fmt.Errorf("planner: %w", err)
		}
	}
	cfg = cfg.withDefaults()
	if cfg.WhatIf != nil {
		w := *cfg.WhatIf
		if w.Warmup == 0 {
			w.Warmup = 120
		}
		if w.Steady == 0 {
			w.Steady = 0.1
		}
		cfg.WhatIf = &w
	}
	return &Planner{cfg: cfg, log: cfg.Logger, fc: newForecaster(cfg.Alpha, cfg.Beta), learn: newLearned(), coolUntil: math.Inf(-1)}, nil
}

// Config returns the planner's configuration with defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// prefillMiss is the share of requests the planner expects to miss their
// SLO with the prefill side at utilisation u: early rejection sheds what
// exceeds the usable capacity, the rest meet their TTFT.
func (p *Planner) prefillMiss(u float64) float64 {
	if u <= p.cfg.PrefillUtil {
		return 0
	}
	return 1 - p.cfg.PrefillUtil/u
}

// decodeMiss is the expected miss share with the decode side at
// utilisation u: past capacity every stream's TPOT degrades, so misses
// climb steeply to all requests.
func (p *Planner) decodeMiss(u float64) float64 {
	if u <= p.cfg.DecodeUtil {
		return 0
	}
	return min(1, (u-p.cfg.DecodeUtil)/p.cfg.DecodeSlack)
}

// loss is the expected miss share of a split: its worse side's (a request
// must pass both).
func (p *Planner) loss(lp, ld float64, np, nd int, c Capacity) float64 {
	up, ud := Utilisation(lp, ld, np, nd, c)
	return max(p.prefillMiss(up), p.decodeMiss(ud))
}

// headroom is how close a split runs to the usable capacity of its fuller
// side (1: at it).
func (p *Planner) headroom(lp, ld float64, np, nd int, c Capacity) float64 {
	up, ud := Utilisation(lp, ld, np, nd, c)
	return max(up/p.cfg.PrefillUtil, ud/p.cfg.DecodeUtil)
}

// Decide makes one planning step from the window just observed and the
// fleet as the actuator reports it. It does not act: the caller applies a
// switch decision through an actuator (Loop does).
func (p *Planner) Decide(ctx context.Context, obs *Observation, inst []Instance) Decision {
	np, nd, switching := counts(inst)
	d := Decision{At: obs.Now, Prefill: np, Decode: nd, Switching: switching, TargetPrefill: np, TargetDecode: nd, Shape: obs.Shape()}
	total := p.cfg.Total
	if total == 0 {
		total = len(inst)
	}
	lp, ld := obs.Loads()
	if obs.Window > 0 {
		p.fc.observe(obs.Now, lp, ld)
	}
	base := p.cfg.Capacity.Estimate(d.Shape)
	if p.cfg.Learn && switching == 0 && obs.Now >= p.coolUntil && p.fc.windows() > 0 {
		c := p.learn.apply(base)
		up, ud := Utilisation(lp, ld, np, nd, c)
		p.learn.update(obs, up, ud, p.cfg.PrefillUtil, p.cfg.DecodeUtil)
	}
	c := p.learn.apply(base)
	d.Capacity = c
	// Size for when a change made now would serve: after the next
	// interval and a warm-up, from a window whose mean lags by half its
	// length.
	ahead := p.cfg.Interval + p.cfg.Warmup + obs.Window/2
	d.PrefillLoad, d.DecodeLoad = p.fc.at(ahead, p.cfg.Band)
	up, ud := Utilisation(d.PrefillLoad, d.DecodeLoad, np, nd, c)
	d.PrefillUtil, d.DecodeUtil = finite(up), finite(ud)

	if switching > 0 {
		return p.wait(d, fmt.Sprintf("a change is in flight (%d instances switching)", switching))
	}
	if p.fc.windows() < p.cfg.MinWindows {
		return p.wait(d, fmt.Sprintf("observing: %d of %d windows", p.fc.windows(), p.cfg.MinWindows))
	}
	if np+nd != total {
		return p.cannotPlan(d, fmt.Sprintf("the fleet has %d serving instances, not the budget of %d: not planning", np+nd, total))
	}
	if obs.Now < p.coolUntil {
		return p.hold(d, fmt.Sprintf("cool-down until %.0fs (%.0fs after the last change started)", p.coolUntil, p.cfg.Cooldown))
	}
	return p.plan(ctx, d, obs, inst, total)
}

// plan chooses the target split and whether to move to it now.
func (p *Planner) plan(ctx context.Context, d Decision, obs *Observation, inst []Instance, total int) Decision {
	np, c := d.Prefill, d.Capacity
	lp, ld := d.PrefillLoad, d.DecodeLoad
	lo, hi := p.cfg.MinPrefill, total-p.cfg.MinDecode
	if lo > hi {
		return p.cannotPlan(d, fmt.Sprintf("budget %d cannot hold %d prefill and %d decode instances", total, p.cfg.MinPrefill, p.cfg.MinDecode))
	}
	p.cannot = ""
	cur := p.loss(lp, ld, np, total-np, c)
	sp, sd := p.fc.smoothed()
	now := p.loss(sp, sd, np, total-np, c)
	// Misses the formula does not explain (its capacity may be wrong) are
	// the simulator's to judge, when there is one.
	unexplained := p.cfg.WhatIf != nil && obs.Recent != nil && obs.missShare() > p.cfg.Margin
	if now == 0 && !unexplained {
		p.pendingN = 0
		up, ud := Utilisation(sp, sd, np, total-np, c)
		return p.hold(d, fmt.Sprintf("the current split %dP%dD meets its targets: prefill %.0f%%, decode %.0f%% utilised",
			np, total-np, 100*up, 100*ud))
	}
	t := p.target(ctx, &d, obs, lo, hi, total, cur, unexplained)
	if t.best == np {
		p.pendingN = 0
		return p.hold(d, fmt.Sprintf("the current split %dP%dD is best (%s): prefill %.0f%%, decode %.0f%% utilised",
			np, total-np, t.source, 100*d.PrefillUtil, 100*d.DecodeUtil))
	}
	dir := 1
	if t.best < np {
		dir = -1
	}
	sw := p.switchSeconds(obs, dir)
	chosen, why := p.step(&d, t, dir, sw, cur, total)
	if chosen == 0 {
		p.pendingN = 0
		return p.hold(d, "no worthwhile change: "+strings.Join(dedupe(why), "; "))
	}
	if p.pendingDir != dir {
		p.pendingDir, p.pendingN = dir, 0
	}
	p.pendingN++
	q := np + dir*chosen
	d.Gain = t.gainOf(q)
	d.SwitchSeconds = sw
	// A simulated choice replayed minutes of traffic: it is not a one-window
	// blip and needs no confirmation.
	if p.pendingN < p.cfg.Confirm && now < p.cfg.BigGain && d.WhatIf == nil {
		return p.hold(d, fmt.Sprintf("%dP%dD proposed (%d of %d confirmations)", q, total-q, p.pendingN, p.cfg.Confirm))
	}
	p.pendingN = 0
	return p.switchTo(d, obs, inst, t.source, dir, chosen, total)
}

// target is the split plan aims at: the formula's best, or the what-if
// simulation's when one ran, with the gain of each split as its source
// measures it.
type target struct {
	best   int
	gainOf func(prefill int) float64
	source string
}

// target picks the split to aim at from d's loads (cur: the expected
// misses of the current split): the formula's best split at the loads
// plus the band, replaced by the what-if simulation's pick when the
// formula wants a change, expects misses, or the fleet measures misses it
// does not explain (unexplained), and a simulation is due and the load
// steady. It sets d's target and, after a simulation, d.WhatIf.
func (p *Planner) target(ctx context.Context, d *Decision, obs *Observation, lo, hi, total int, cur float64, unexplained bool) target {
	np, c := d.Prefill, d.Capacity
	lp, ld := d.PrefillLoad, d.DecodeLoad
	hb := 1 + p.cfg.Band
	t := target{best: p.formulaBest(lp*hb, ld*hb, lo, hi, np, total, c), source: "formula"}
	t.gainOf = func(q int) float64 { return cur - p.loss(lp, ld, q, total-q, c) }
	d.TargetPrefill, d.TargetDecode = t.best, total-t.best
	w := p.cfg.WhatIf
	if w == nil || obs.Recent == nil || !(t.best != np || cur > 0 || unexplained) ||
		obs.Now-p.lastWhatIf < w.Every || !p.fc.steady(p.cfg.Interval+p.cfg.Warmup, w.Steady) {
		return t
	}
	p.lastWhatIf = obs.Now
	cands, err := w.evaluate(ctx, obs.Recent, obs.Window, candidateSplits(t.best, np, lo, hi, w.Spread), total)
	if err != nil {
		p.log.Warn("planner: what-if simulation failed; using the formula", "err", err)
		return t
	}
	d.WhatIf = cands
	t.best, t.gainOf = pickSimulated(cands, np, t.best)
	t.source = "simulation"
	d.TargetPrefill, d.TargetDecode = t.best, total-t.best
	return t
}

// step is the largest worthwhile step towards t.best in direction dir
// that the giving side can absorb, priced with the sw seconds its
// instances are out of service (0: none; why says what each step lacked).
func (p *Planner) step(d *Decision, t target, dir int, sw, cur float64, total int) (chosen int, why []string) {
	np, c := d.Prefill, d.Capacity
	lp, ld := d.PrefillLoad, d.DecodeLoad
	steps := abs(t.best - np)
	if p.cfg.MaxStep > 0 {
		steps = min(steps, p.cfg.MaxStep)
	}
	hp, hd := p.fc.lastP, p.fc.lastD
	chosenNet := 0.0
	for k := steps; k >= 1; k-- {
		q := np + dir*k
		g := t.gainOf(q)
		if g < p.cfg.Margin {
			why = append(why, fmt.Sprintf("%dP%dD gains %.1f points, under the %.1f-point margin", q, total-q, 100*g, 100*p.cfg.Margin))
			continue
		}
		simGain := math.NaN()
		if d.WhatIf != nil {
			simGain = g
		}
		if ok, msg := p.absorbs(hp, hd, lp, ld, np, total-np, dir, k, c, simGain); !ok {
			why = append(why, msg)
			continue
		}
		// While k instances drain and warm up, the giving side is short
		// of them and the other side has not gained them yet.
		during := p.duringLoss(lp, ld, np, total-np, dir, k, c)
		net := (p.cfg.Horizon-sw)*g - sw*max(during-cur, 0)
		if net <= 0 {
			why = append(why, fmt.Sprintf("%dP%dD: a %.0fs switch would not pay off within the %.0fs horizon", q, total-q, sw, p.cfg.Horizon))
			continue
		}
		if net > chosenNet {
			chosen, chosenNet = k, net
		}
	}
	return chosen, why
}

// switchTo turns d into the switch of chosen instances in direction dir
// (which instances, the reason) and starts the cool-down.
func (p *Planner) switchTo(d Decision, obs *Observation, inst []Instance, source string, dir, chosen, total int) Decision {
	c, lp, ld := d.Capacity, d.PrefillLoad, d.DecodeLoad
	q := d.Prefill + dir*chosen
	from, to := fleet.RoleDecode, fleet.RolePrefill
	if dir < 0 {
		from, to = fleet.RolePrefill, fleet.RoleDecode
	}
	names := pickInstances(inst, from, chosen)
	if dir > 0 {
		d.ToPrefill = names
	} else {
		d.ToDecode = names
	}
	d.TargetPrefill, d.TargetDecode = q, total-q
	d.Action = ActionSwitch
	d.Reason = fmt.Sprintf("%s: %dP%dD → %dP%dD: load prefill %.0f tok/s, decode %.0f tok/s (capacity %.0f / %.0f per instance); utilisation now %s / %s, after %s / %s; predicted attainment +%.1f points; moving %d %s→%s instance(s) takes ~%.0fs (drain + warm-up)",
		source, d.Prefill, d.Decode, q, total-q, lp, ld, c.Prefill, c.Decode, utilText(d.PrefillUtil, d.Prefill), utilText(d.DecodeUtil, d.Decode),
		utilText(util(lp, q, c.Prefill), q), utilText(util(ld, total-q, c.Decode), total-q), 100*d.Gain, chosen, from, to, d.SwitchSeconds)
	p.coolUntil = obs.Now + p.cfg.Cooldown
	p.log.Info("planner: switch", "at", d.At, "to_prefill", d.ToPrefill, "to_decode", d.ToDecode, "reason", d.Reason)
	return d
}

// formulaBest is the split in [lo, hi] with the least expected misses, then
// the most headroom on its fuller side, then the closest to the current
// one.
func (p *Planner) formulaBest(lp, ld float64, lo, hi, np, total int, c Capacity) int {
	best := -1
	var bl, bu float64
	for q := lo; q <= hi; q++ {
		l := p.loss(lp, ld, q, total-q, c)
		u := p.headroom(lp, ld, q, total-q, c)
		if best < 0 || l < bl || (l == bl && (u < bu || (u == bu && abs(q-np) < abs(best-np)))) {
			best, bl, bu = q, l, u
		}
	}
	return best
}

// absorbs checks that the side giving up k instances can carry the load it
// has now (the last window's, hp and hd) with what remains: at most
// AbsorbMax utilised, or — when the other side needs them more — with no
// more misses created on it than the move saves on the other side at the
// forecast load (lp, ld), or, when the simulator chose the split, than the
// simulated gain simGain (NaN: not simulated).
func (p *Planner) absorbs(hp, hd, lp, ld float64, np, nd, dir, k int, c Capacity, simGain float64) (bool, string) {
	nq, nr := np+dir*k, nd-dir*k
	upNow, udNow := Utilisation(hp, hd, nq, nr, c)
	upWas, udWas := Utilisation(hp, hd, np, nd, c)
	upF, udF := Utilisation(lp, ld, np, nd, c)
	upT, udT := Utilisation(lp, ld, nq, nr, c)
	giver, side := udNow, "decode"
	created := p.decodeMiss(udNow) - p.decodeMiss(udWas)
	saved := p.prefillMiss(upF) - p.prefillMiss(upT)
	if dir < 0 {
		giver, side = upNow, "prefill"
		created = p.prefillMiss(upNow) - p.prefillMiss(upWas)
		saved = p.decodeMiss(udF) - p.decodeMiss(udT)
	}
	if !math.IsNaN(simGain) {
		saved = simGain
	}
	if giver <= p.cfg.AbsorbMax || created <= saved {
		return true, ""
	}
	return false, fmt.Sprintf("%dP%dD: the remaining %s instances would run at %.0f%% of the current load (absorb limit %.0f%%) and lose more than the move saves",
		nq, nr, side, 100*giver, 100*p.cfg.AbsorbMax)
}

// duringLoss is the expected miss share while k instances move.
func (p *Planner) duringLoss(lp, ld float64, np, nd, dir, k int, c Capacity) float64 {
	if dir > 0 {
		return p.loss(lp, ld, np, nd-k, c)
	}
	return p.loss(lp, ld, np-k, nd, c)
}

// switchSeconds estimates how long moved instances are out of service:
// warm-up plus the drain of the side giving them up — a prefill queue (the
// mean TTFT), or a decode batch (the longest stream left, about 1.5 × the
// mean output at the measured TPOT).
func (p *Planner) switchSeconds(obs *Observation, dir int) float64 {
	s := obs.Shape()
	if dir > 0 {
		return p.cfg.Warmup + 1.5*s.OSL*obs.MeanTPOT
	}
	return p.cfg.Warmup + obs.MeanTTFT
}

// utilText is a utilisation in percent, or "no instances" for a side
// with none (it read 100000000000%).
func utilText(u float64, n int) string {
	if n <= 0 {
		return "no instances"
	}
	return fmt.Sprintf("%.0f%%", 100*u)
}

// pickInstances names the k serving instances of role with the least load
// (they drain first), ties by name.
func pickInstances(inst []Instance, role fleet.Role, k int) []string {
	var c []Instance
	for _, in := range inst {
		if !in.Switching && in.Role == role {
			c = append(c, in)
		}
	}
	sort.SliceStable(c, func(i, j int) bool {
		if c[i].Load != c[j].Load {
			return c[i].Load < c[j].Load
		}
		return c[i].Name < c[j].Name
	})
	out := make([]string, 0, k)
	for i := 0; i < k && i < len(c); i++ {
		out = append(out, c[i].Name)
	}
	return out
}

// hold and wait decide no change, for reason, logged at debug level (a
// switch is logged at info).
func (p *Planner) hold(d Decision, reason string) Decision {
	d.Action, d.Reason = ActionHold, reason
	p.log.Debug("planner: hold", "at", d.At, "reason", reason)
	return d
}

// cannotPlan holds because the fleet cannot be planned as configured
// (its size is not the budget, the budget cannot hold the minimums): a
// warning the first time for a reason, not only a decision's.
func (p *Planner) cannotPlan(d Decision, reason string) Decision {
	if reason != p.cannot {
		p.log.Warn("planner: cannot plan the fleet", "why", reason)
		p.cannot = reason
	}
	return p.hold(d, reason)
}

func (p *Planner) wait(d Decision, reason string) Decision {
	d.Action, d.Reason = ActionWait, reason
	p.log.Debug("planner: wait", "at", d.At, "reason", reason)
	return d
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func dedupe(s []string) []string {
	slices.Sort(s)
	s = slices.Compact(s)
	if len(s) > 3 {
		s = append(s[:3], fmt.Sprintf("and %d more", len(s)-3))
	}
	return s
}
