package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/planner"
)

type planFlags struct {
	scenario, format, phases, fixed, policy string
	total                                   int
	prefillCap, decodeCap                   float64
	phaseMinutes, transitionMinutes, noise  float64
	noiseMinutes, warmup, interval          float64
	seed                                    uint64
	whatIf, verbose, learn                  bool
}

func newPlanFlagSet(f *planFlags, stderr io.Writer) (*flag.FlagSet, *flagrange.Flags) {
	fs := flag.NewFlagSet("kvgate plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate plan [flags]\n\nSizes the prefill and decode instances (xPyD) a load's phases need against\na fixed split (--scenario seed-phases, the default), or runs the planner\nover a simulated day against fixed splits and oracles (--scenario\nsimulated-day) (docs/planner.md).\n\nFlags:")
		fs.PrintDefaults()
	}
	fl := flagrange.New(fs)
	sl, dl := planner.SizingLimits(), planner.DayLimits()
	day := planner.DefaultDay()
	seed := planner.SeedCapacity()
	*f = planFlags{scenario: "seed-phases", format: "table", fixed: "12P12D", policy: day.Policy, total: 24,
		prefillCap: seed.Prefill, decodeCap: seed.Decode, phaseMinutes: day.PhaseMinutes, transitionMinutes: day.TransitionMinutes,
		noise: day.Noise, noiseMinutes: day.NoiseMinutes, warmup: day.Warmup, interval: day.Interval}
	fs.StringVar(&f.scenario, "scenario", f.scenario, "seed-phases (the seed's sizing table) or simulated-day (fixed, best fixed, planner and oracle over a simulated day)")
	fs.StringVar(&f.format, "format", f.format, "output: table or json")
	fs.StringVar(&f.phases, "phases", "", "YAML or JSON file of phases ({phases: [{name, rate, isl, osl, hit, minutes}]}); default: the seed's chat, long-documents, agents")
	fs.StringVar(&f.fixed, "fixed", f.fixed, "the fixed split to compare, as <P>P<D>D (default: half of --total each side, 12P12D of 24)")
	flagrange.Var(fl, &f.total, "total", sl.Total, "instances in the budget")
	flagrange.Var(fl, &f.prefillCap, "prefill-capacity", sl.PrefillCapacity, "uncached prompt tokens per second one prefill instance computes (simulated-day: when given, the planner is configured with it instead of the timing model's)")
	flagrange.Var(fl, &f.decodeCap, "decode-capacity", sl.DecodeCapacity, "output tokens per second one decode instance produces within the TPOT target (simulated-day: as --prefill-capacity)")
	flagrange.Var(fl, &f.phaseMinutes, "phase-minutes", dl.PhaseMinutes, "simulated-day: length of a phase without its own minutes")
	flagrange.Var(fl, &f.transitionMinutes, "transition-minutes", dl.TransitionMinutes, "simulated-day: how long one phase takes to give way to the next")
	flagrange.Var(fl, &f.noise, "noise", dl.Noise, "simulated-day: amplitude of the arrival rate's random drift (0.1 = ±10 %)")
	flagrange.Var(fl, &f.noiseMinutes, "noise-minutes", dl.NoiseMinutes, "simulated-day: minutes between the drift's random values")
	flagrange.Var(fl, &f.warmup, "warmup", dl.Warmup, "simulated-day: seconds a switched instance warms up after draining")
	flagrange.Var(fl, &f.interval, "interval", dl.Interval, "simulated-day: seconds between planner decisions")
	fs.Uint64Var(&f.seed, "seed", 0, "simulated-day: random seed (any uint64)")
	fs.StringVar(&f.policy, "policy", f.policy, "simulated-day: routing policy")
	fs.BoolVar(&f.whatIf, "what-if", false, "simulated-day: also run the planner that simulates candidate splits on the recent traffic")
	fs.BoolVar(&f.learn, "learn", false, "simulated-day: the planner corrects its capacity estimate from measured SLO misses")
	fs.BoolVar(&f.verbose, "v", false, "simulated-day: log every planner decision to stderr (switches, holds and waits, each with its reason and run)")
	return fs, fl
}

var splitRE = regexp.MustCompile(`^(?i)(\d{1,9})P(\d{1,9})D$`)

// parseSplit reads <P>P<D>D.
func parseSplit(s string, total int) (p, d int, err error) {
	m := splitRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, 0, fmt.Errorf("--fixed %q: want <P>P<D>D, e.g. 12P12D", s)
	}
	p, _ = strconv.Atoi(m[1])
	d, _ = strconv.Atoi(m[2])
	r := planner.SizingLimits().Instances
	if err := r.Check("--fixed prefill", p); err != nil {
		return 0, 0, err
	}
	if err := r.Check("--fixed decode", d); err != nil {
		return 0, 0, err
	}
	if p > total-d {
		return 0, 0, fmt.Errorf("--fixed %dP%dD needs %d instances, more than --total %d", p, d, p+d, total)
	}
	return p, d, nil
}

func loadPhases(path string) ([]planner.Phase, error) {
	if path == "" {
		return planner.SeedPhases(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ph, err := planner.ParsePhases(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ph, nil
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f planFlags
	fs, fl := newPlanFlagSet(&f, stderr)
	if err := parseFlags(fs, fl, args); err != nil {
		return err
	}
	if f.format != "table" && f.format != "json" {
		return fmt.Errorf("unknown format %q (table or json)", f.format)
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if !set["fixed"] {
		// The default compares the half-and-half split of --total (the
		// seed's 12P12D of 24), so that --total alone is enough.
		f.fixed = fmt.Sprintf("%dP%dD", f.total/2, f.total-f.total/2)
	}
	fp, fd, err := parseSplit(f.fixed, f.total)
	if err != nil {
		return err
	}
	phases, err := loadPhases(f.phases)
	if err != nil {
		return err
	}
	switch f.scenario {
	case "seed-phases":
		var dayOnly []string
		for _, name := range []string{"phase-minutes", "transition-minutes", "noise", "noise-minutes", "warmup", "interval", "seed", "policy", "what-if", "learn", "v"} {
			if set[name] {
				dayOnly = append(dayOnly, "--"+name)
			}
		}
		if len(dayOnly) > 0 {
			return fmt.Errorf("%s: only with --scenario simulated-day (the seed's sizing table is arithmetic)", strings.Join(dayOnly, ", "))
		}
		return planSeedPhases(stdout, &f, phases, fp, fd)
	case "simulated-day":
		if fp+fd != f.total {
			return fmt.Errorf("simulated-day: --fixed %dP%dD must use all --total %d instances", fp, fd, f.total)
		}
		return planDay(ctx, stdout, stderr, &f, phases, fp, set["prefill-capacity"] || set["decode-capacity"])
	}
	return fmt.Errorf("unknown scenario %q (seed-phases, simulated-day)", f.scenario)
}

// pct formats a load as the seed's Python does ({x:.0%}).
func pct(x float64) string { return strconv.FormatFloat(x*100, 'f', 0, 64) + "%" }

func planSeedPhases(w io.Writer, f *planFlags, phases []planner.Phase, fp, fd int) error {
	rows := planner.SizePhases(phases, planner.Capacity{Prefill: f.prefillCap, Decode: f.decodeCap}, f.total, fp, fd)
	if f.format == "json" {
		// Loads rounded to hundredths, as the issue shows them.
		for i := range rows {
			rows[i].FixedPrefillLoad = round(rows[i].FixedPrefillLoad, 2)
			rows[i].FixedDecodeLoad = round(rows[i].FixedDecodeLoad, 2)
		}
		out := struct {
			Phases []planner.PhaseSizing `json:"phases"`
		}{Phases: rows}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(w, "fixed %dP%dD vs adjusting per phase (%d instances in total):\n", fp, fd, f.total)
	for _, r := range rows {
		fits := "fits"
		if !r.Fits {
			fits = "does not fit"
		}
		side := func(name string, x float64) string {
			s := name + " load " + pct(x)
			if x > 1 {
				s += " (overloaded)"
			}
			return s
		}
		fmt.Fprintf(w, "  %s: needs %dP%dD (%s); under the fixed split %s; %s\n", r.Name, r.Prefill, r.Decode, fits,
			side("prefill", r.FixedPrefillLoad), side("decode", r.FixedDecodeLoad))
	}
	return nil
}

func planDay(ctx context.Context, stdout, stderr io.Writer, f *planFlags, phases []planner.Phase, fixed int, capSet bool) error {
	c := planner.DefaultDay()
	if capSet {
		c.PlannerCapacity = &planner.Capacity{Prefill: f.prefillCap, Decode: f.decodeCap}
	}
	c.Learn = f.learn
	c.Phases, c.Instances, c.Seed, c.Policy = phases, f.total, f.seed, f.policy
	c.PhaseMinutes, c.TransitionMinutes, c.Noise, c.NoiseMinutes = f.phaseMinutes, f.transitionMinutes, f.noise, f.noiseMinutes
	c.Warmup, c.Interval = f.warmup, f.interval
	if f.verbose {
		c.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if c.Instances > planner.DayLimits().Instances.Max {
		return fmt.Errorf("simulated-day: --total %d: at most %d instances", c.Instances, planner.DayLimits().Instances.Max)
	}
	rep, err := planner.RunDay(ctx, c, planner.DayOptions{FixedPrefill: fixed, WhatIf: f.whatIf})
	if err != nil {
		return err
	}
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printDay(stdout, rep)
}

func printDay(w io.Writer, rep *planner.DayReport) error {
	fmt.Fprintf(w, "simulated day: %d requests over %.4g minutes, %d instances\n\n", rep.Requests, rep.Minutes, rep.Instances)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	head := "run\tsplit\tattain\tTTFT ok\tTPOT ok\trejected\tswitches"
	if len(rep.Runs) > 0 {
		for _, p := range rep.Runs[0].Phases {
			head += "\t" + p.Name
		}
	}
	fmt.Fprintln(tw, head+"\t")
	for _, r := range rep.Runs {
		line := fmt.Sprintf("%s\t%s\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t%d", r.Name, r.Split, 100*r.Attainment, 100*r.TTFTAttainment,
			100*r.TPOTAttainment, 100*r.Rejected, r.Switches)
		if r.Changes > 0 {
			line += fmt.Sprintf(" in %d", r.Changes)
		}
		for _, p := range r.Phases {
			line += fmt.Sprintf("\t%.1f%%", 100*p.Attainment)
		}
		fmt.Fprintln(tw, line+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Runs {
		if len(r.Log) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s switches:\n", r.Name)
		for _, d := range r.Log {
			fmt.Fprintf(w, "  %6.0fs  %s\n", d.At, d.Reason)
		}
	}
	return nil
}
