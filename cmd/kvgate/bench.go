package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/flagrange"
)

type benchFlags struct {
	url, model, workload, trace, api, arrivals, rates, format, csvPath, htmlPath, label         string
	headers                                                                                     []string
	rate, duration, traceScale, timeScale, sloTTFT, sloTPOT, timeout                            float64
	concurrency, requests, sessions, systems, systemTokens, turnTokens, outputTokens, maxOutput int
	seed                                                                                        uint64
	noStream                                                                                    bool
}

func newBenchFlagSet(f *benchFlags, stderr io.Writer) (*flag.FlagSet, *flagrange.Flags) {
	fs := flag.NewFlagSet("kvgate bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fl := flagrange.New(fs)
	fs.StringVar(&f.url, "url", "", "base URL of an OpenAI-compatible server (kvgate, vLLM, another router), e.g. http://127.0.0.1:8000; comma-separated URLs of gateway replicas get the requests in turn")
	fs.StringVar(&f.model, "model", "", "model name to request")
	fs.StringVar(&f.workload, "workload", "chat", "chat (the baseline chapter's multi-turn chat, as text) or trace (--trace)")
	fs.StringVar(&f.trace, "trace", "", "Mooncake-format JSON-lines trace to replay (each 512-token hash id becomes the same text everywhere)")
	fs.StringVar(&f.api, "api", "completions", "completions, chat, responses (the Responses API: the chat workload's system prompt as instructions, its turns as input items) or messages (Anthropic's Messages API: the system prompt as its system; vLLM reports no cache hits there, SGLang does)")
	fs.StringVar(&f.arrivals, "arrivals", "poisson", "open-loop arrivals: poisson, constant, or trace (--workload trace: the trace's timestamps, not with --rate or --rates)")
	fs.StringVar(&f.rates, "rates", "", "a rate ladder: comma-separated rates, one run each (overrides --rate); each rung draws its own workload (rung k: --seed + k; a trace's prompts marked as rung k's), so that no rung finds an earlier one's prompts cached")
	fs.StringVar(&f.format, "format", "table", "table or json")
	fs.StringVar(&f.csvPath, "csv", "", "write one line per request to this file")
	fs.StringVar(&f.htmlPath, "html", "", "write an HTML report with plots to this file")
	fs.Func("header", "extra request header NAME:VALUE (e.g. X-Kvgate-Class:batch; repeatable)", func(v string) error {
		if len(f.headers) == 64 {
			return fmt.Errorf("at most 64 headers")
		}
		f.headers = append(f.headers, v)
		return nil
	})
	fs.StringVar(&f.label, "label", "", "name of the run in reports (default: the URL)")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed of the workload and arrivals (a --rates ladder's rung k uses seed+k)")
	fs.BoolVar(&f.noStream, "no-stream", false, "send chat, completion and messages requests unstreamed (not --api responses, not with --slo-tpot): an answer's arrival is its first token (TTFT = end-to-end), no TPOT nor inter-token latency")
	// A request's timeout is only there to end a stream that stopped
	// without ending (without one bench waited for it forever): an hour of
	// the server's time lets a 32 768-token reasoning answer stream at 100
	// ms a token, a loaded server's pace. vLLM's benchmark waits 6 h.
	f.rate, f.duration, f.traceScale, f.timeScale, f.sloTTFT, f.timeout = 10, 60, 1, 1, 2, 3600
	f.sessions, f.systems, f.systemTokens, f.turnTokens, f.outputTokens = 400, 20, 2048, 300, 64
	flagrange.Var(fl, &f.rate, "rate", flagrange.Range[float64]{Min: 0.001, Max: 1e6, Unit: "req/s"}, "open-loop arrival rate")
	flagrange.Var(fl, &f.duration, "duration", flagrange.Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds"}, "chat: seconds of arrivals (in the server's time: see --time-scale)")
	flagrange.Var(fl, &f.concurrency, "concurrency", flagrange.Range[int]{Min: 1, Max: 100000, Zero: "open loop"}, "closed loop: this many requests in flight, each sent when one ends")
	flagrange.Var(fl, &f.requests, "requests", flagrange.Range[int]{Min: 1, Max: 1000000, Zero: "all"}, "send at most this many requests")
	flagrange.Var(fl, &f.traceScale, "trace-time-scale", flagrange.Range[float64]{Min: 1e-6, Max: 1e6}, "multiply trace timestamps by this (0.25 = four times the rate)")
	flagrange.Var(fl, &f.timeScale, "time-scale", flagrange.Range[float64]{Min: 1e-3, Max: 1e6}, "the server runs this many times faster than real time (kvgate engine --time-scale): arrivals are compressed and latencies reported in its time")
	flagrange.Var(fl, &f.sloTTFT, "slo-ttft", flagrange.Range[float64]{Min: 1e-4, Max: 86400, Unit: "seconds", Zero: "none"}, "TTFT target for attainment and goodput")
	flagrange.Var(fl, &f.sloTPOT, "slo-tpot", flagrange.Range[float64]{Min: 1e-5, Max: 3600, Unit: "seconds", Zero: "none"}, "TPOT target for attainment and goodput (not with --no-stream)")
	flagrange.Var(fl, &f.timeout, "timeout", flagrange.Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds"}, "cut a request whose answer has not ended this long after its sending (in the server's time); its outcome is timeout")
	flagrange.Var(fl, &f.sessions, "sessions", flagrange.Range[int]{Min: 1, Max: 1 << 20}, "chat: conversations")
	flagrange.Var(fl, &f.systems, "systems", flagrange.Range[int]{Min: 1, Max: 1 << 16}, "chat: system prompts")
	flagrange.Var(fl, &f.systemTokens, "system-tokens", flagrange.Range[int]{Min: 0, Max: 1 << 20}, "chat: words per system prompt")
	flagrange.Var(fl, &f.turnTokens, "turn-tokens", flagrange.Range[int]{Min: 1, Max: 1 << 20}, "chat: words appended per turn")
	flagrange.Var(fl, &f.outputTokens, "output-tokens", flagrange.Range[int]{Min: 1, Max: 1 << 20}, "chat: max_tokens per request")
	flagrange.Var(fl, &f.maxOutput, "max-output-tokens", flagrange.Range[int]{Min: 1, Max: 1 << 20, Zero: "the trace's"}, "trace: cap output lengths")
	return fs, fl
}

// runBench is kvgate bench.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f benchFlags
	fs, fl := newBenchFlagSet(&f, stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate bench --url URL --model M [flags]\n\nSends a workload to an OpenAI-compatible server and measures every streamed\nanswer (TTFT, inter-token latency, TPOT, end-to-end; in an open loop from when\neach request was due); prints percentiles, SLO attainment and goodput, and\nwrites CSV and an HTML report on request.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, fl, args); err != nil {
		return err
	}
	if err := benchCheck(&f, fs); err != nil {
		return err
	}
	rates, err := benchRates(&f)
	if err != nil {
		return err
	}
	client, err := benchClient(&f, stderr)
	if err != nil {
		return err
	}
	runs, err := benchLadder(ctx, client, &f, rates, stderr)
	if err != nil {
		return err
	}
	if err := benchOutput(&f, runs, stdout); err != nil {
		return err
	}
	return benchVerdict(runs)
}

// benchCheck refuses flags that contradict each other, which were
// otherwise ignored in silence.
func benchCheck(f *benchFlags, fs *flag.FlagSet) error {
	if f.url == "" || f.model == "" {
		return fmt.Errorf("--url and --model are required")
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.concurrency > 0 && (set["arrivals"] || set["rate"]) {
		// A closed loop sends each request when one ends: it has no
		// arrivals (they were ignored in silence).
		return &usageError{err: errors.New("--arrivals and --rate: open-loop settings, not with --concurrency (a closed loop sends a request as one ends)")}
	}
	switch {
	case f.noStream && f.api == "responses":
		// A usage error as the others (it exited 1 after the setup).
		return &usageError{err: errors.New("--no-stream: chat, completions and messages only, not --api responses")}
	case f.noStream && f.sloTPOT > 0:
		// An unstreamed answer has no TPOT: the target was met by every
		// answer, whatever its pace.
		return &usageError{err: errors.New("--slo-tpot: an unstreamed answer (--no-stream) has no TPOT to meet it")}
	case f.arrivals == "trace" && f.workload != "trace":
		// The chat workload has no trace timestamps: it was sent as
		// Poisson arrivals, and its JSON had no rate.
		return &usageError{err: fmt.Errorf("--arrivals trace: the trace's timestamps, for --workload trace only (--workload %s: poisson or constant)", f.workload)}
	case f.arrivals == "trace" && (set["rate"] || set["rates"]):
		// The trace's timestamps are its arrivals: every rung of a
		// ladder was the same run.
		return &usageError{err: errors.New("--rate and --rates: not with --arrivals trace (the trace's timestamps are its arrivals; --trace-time-scale changes its rate)")}
	}
	return nil
}

// benchLadder runs the workload at each rate, rung k drawn with seed + k
// (benchItems), and stops after the run during which ctx ended, marked
// interrupted.
func benchLadder(ctx context.Context, client *bench.Client, f *benchFlags, rates []float64, stderr io.Writer) ([]bench.RunResult, error) {
	label := f.label
	if label == "" {
		label = f.url
	}
	var runs []bench.RunResult
	for k, rate := range rates {
		items, err := benchItems(f, rate, k)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return nil, fmt.Errorf("the workload at %g req/s for --duration %g s has no request (Poisson arrivals drew none within it): give a longer --duration or a higher rate", rate, f.duration)
		}
		name := label
		if len(rates) > 1 {
			name = fmt.Sprintf("%s @%g", label, rate)
		}
		rr, err := benchRun(ctx, client, items, f, name, stderr)
		if err != nil {
			return nil, err
		}
		if f.concurrency == 0 && f.arrivals != "trace" {
			rr.Summary.Rate = rate
		}
		rr.Summary.Interrupted = ctx.Err() != nil
		runs = append(runs, rr)
		reportFailures(stderr, rr)
		if ctx.Err() != nil {
			break
		}
	}
	return runs, nil
}

// benchVerdict is bench's exit: an error when no request of any run
// succeeded, interrupted or not (an interrupted run exited 0 whatever it
// had served).
func benchVerdict(runs []bench.RunResult) error {
	interrupted := false
	for _, r := range runs {
		if r.Summary.Outcomes["ok"] > 0 {
			return nil
		}
		interrupted = interrupted || r.Summary.Interrupted
	}
	if interrupted {
		return fmt.Errorf("interrupted, and no request succeeded (the first error of each kind is above; --csv has every request's)")
	}
	return fmt.Errorf("no request succeeded (the first error of each kind is above; --csv has every request's)")
}

// benchClient checks the flags a run does not read until its end (its
// outputs) or not at all in some modes, and builds the client.
func benchClient(f *benchFlags, stderr io.Writer) (*bench.Client, error) {
	urls := strings.Split(f.url, ",")
	for i, u := range urls {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fmt.Errorf("--url: %q is not an http(s) base URL", u)
		}
		if trimmed := strings.TrimSuffix(strings.TrimRight(u, "/"), "/v1"); trimmed != strings.TrimRight(u, "/") {
			// An OpenAI SDK's base URL: bench adds /v1/… itself.
			fmt.Fprintf(stderr, "kvgate bench: --url %s: the server's base URL is %s (bench adds the /v1/… paths)\n", u, trimmed)
			urls[i] = trimmed
		}
	}
	if err := outputsWritable(f); err != nil {
		return nil, err
	}
	switch f.format {
	case "table", "json":
	default:
		return nil, fmt.Errorf("--format %q: table or json", f.format)
	}
	switch f.arrivals {
	case "poisson", "constant", "trace":
	default:
		return nil, fmt.Errorf("--arrivals %q: poisson, constant or trace", f.arrivals)
	}
	client := &bench.Client{URL: urls[0], More: urls[1:], Model: f.model, TimeScale: f.timeScale, Responses: f.api == "responses", Messages: f.api == "messages",
		Whole: f.noStream, HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096}},
		// --timeout is in the server's time, the client's in wall time.
		Timeout: max(time.Duration(f.timeout/f.timeScale*float64(time.Second)), 1)}
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--header %q: want NAME:VALUE", h)
		}
		if client.Header == nil {
			client.Header = http.Header{}
		}
		client.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return client, nil
}

// outputsWritable checks, before a run, that the output files' folders
// exist, so that a mistyped path does not cost a finished run.
func outputsWritable(f *benchFlags) error {
	if err := outputWritable("--csv", f.csvPath); err != nil {
		return err
	}
	return outputWritable("--html", f.htmlPath)
}

// outputWritable checks that the folder of the output file path given
// by flag exists ("": no output).
func outputWritable(flag, path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("%s %s: no folder %s to write it in", flag, path, dir)
	}
	return nil
}

// reportFailures tells stderr, for a run whose requests failed, how many
// of each outcome and the first one's error, so that a wrong URL, model
// or API shows without --csv.
func reportFailures(w io.Writer, rr bench.RunResult) {
	first := map[string]string{}
	var kinds []string
	for _, r := range rr.Records {
		if r.Outcome == "ok" {
			continue
		}
		if _, ok := first[r.Outcome]; !ok {
			kinds = append(kinds, r.Outcome)
			msg := r.Error
			if r.Status != 0 {
				msg = fmt.Sprintf("status %d: %s", r.Status, msg)
			}
			first[r.Outcome] = msg
		}
	}
	for _, k := range kinds {
		fmt.Fprintf(w, "kvgate bench: %s: %d %s, the first: %s\n", rr.Summary.Label, rr.Summary.Outcomes[k], k, first[k])
	}
}

func benchRates(f *benchFlags) ([]float64, error) {
	if f.rates == "" {
		return []float64{f.rate}, nil
	}
	if f.concurrency > 0 {
		return nil, fmt.Errorf("--rates: a ladder of open-loop rates, not with --concurrency (a closed loop has no rate)")
	}
	var out []float64
	for _, s := range strings.Split(f.rates, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || !(r >= 0.001 && r <= 1e6) {
			return nil, fmt.Errorf("--rates: %q must be a rate in [0.001, 1e6] req/s", s)
		}
		out = append(out, r)
	}
	if len(out) > 64 {
		return nil, fmt.Errorf("--rates: at most 64 rates")
	}
	return out, nil
}

// benchItems draws rung k of the workload at rate (k = 0 for a single
// run): with seed + k, so that each rung of a ladder sends its own
// prompts and sessions (every rung drawn with the seed resent the first's
// prompts, which found the cache the first had warmed: three rungs at one
// rate hit 52 %, 83 % and 78 %); a trace's prompts, the trace's at every
// rung, are marked as rung k's (bench.MarkRung).
func benchItems(f *benchFlags, rate float64, k int) ([]bench.Item, error) {
	var items []bench.Item
	var err error
	seed := f.seed + uint64(k)
	switch f.workload {
	case "chat":
		count := 0
		if f.concurrency > 0 {
			count = f.requests // a closed loop sends --requests, not rate × duration
		}
		items, err = bench.Chat(bench.ChatConfig{Systems: f.systems, Sessions: f.sessions, SystemTokens: f.systemTokens,
			TurnTokens: f.turnTokens, OutputTokens: f.outputTokens, Rate: rate, Duration: f.duration, Seed: seed, AsChat: f.api != "completions",
			Count: count, Constant: f.arrivals == "constant"})
	case "trace":
		if f.trace == "" {
			return nil, fmt.Errorf("--workload trace needs --trace FILE")
		}
		var fh *os.File
		if fh, err = os.Open(f.trace); err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		defer fh.Close()
		items, err = bench.MooncakeTrace(fh, f.traceScale, f.maxOutput)
		bench.MarkRung(items, k)
		for i := range items {
			items[i].Chat = f.api != "completions"
		}
	default:
		return nil, fmt.Errorf("--workload %q: chat or trace", f.workload)
	}
	if err != nil {
		return nil, err
	}
	switch f.api {
	case "completions", "chat", "responses", "messages":
	default:
		return nil, fmt.Errorf("--api %q: completions, chat, responses or messages", f.api)
	}
	if f.requests > 0 && len(items) > f.requests {
		items = items[:f.requests]
	}
	if f.workload == "trace" && f.arrivals != "trace" && f.concurrency == 0 {
		// Chat's arrivals are its own, at the rate within --duration:
		// drawn again here, the count and the span no longer matched (a
		// walkthrough's 4 s run sent its last request at 6.5 s).
		if err := bench.Schedule(items, f.arrivals, rate, seed); err != nil {
			return nil, err
		}
	}
	return items, nil
}

func benchRun(ctx context.Context, c *bench.Client, items []bench.Item, f *benchFlags, name string, stderr io.Writer) (bench.RunResult, error) {
	bar := newProgressBar(stderr, name)
	recs, wall, err := bench.Run(ctx, c, items, bench.Mode{Concurrency: f.concurrency}, bar.update)
	bar.finish()
	if err != nil {
		return bench.RunResult{}, err
	}
	dur := wall.Seconds() * f.timeScale
	sum := bench.Summarize(name, recs, dur, bench.SLO{TTFT: f.sloTTFT, TPOT: f.sloTPOT})
	sum.Unstreamed = f.noStream
	return bench.RunResult{Summary: sum, Records: recs}, nil
}

// benchOutput writes the runs' outputs; one that fails does not keep the
// others from being written (the table or JSON first).
func benchOutput(f *benchFlags, runs []bench.RunResult, stdout io.Writer) error {
	ss := make([]bench.Summary, len(runs))
	for i, r := range runs {
		ss[i] = r.Summary
	}
	var errs []error
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		errs = append(errs, enc.Encode(map[string]any{"runs": ss}))
	} else {
		errs = append(errs, bench.WriteTable(stdout, ss))
	}
	if f.csvPath != "" {
		errs = append(errs, writeCSV(f.csvPath, runs))
	}
	if f.htmlPath != "" {
		errs = append(errs, writeReport(f.htmlPath, "kvgate bench: "+f.url, runs))
	}
	return errors.Join(errs...)
}

func writeCSV(path string, runs []bench.RunResult) error {
	fh, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--csv: %w", err)
	}
	if err := bench.WriteCSV(fh, runs); err != nil {
		fh.Close()
		return fmt.Errorf("--csv: %w", err)
	}
	if err := fh.Close(); err != nil {
		return fmt.Errorf("--csv: %w", err)
	}
	return nil
}

func writeReport(path, title string, runs []bench.RunResult) error {
	fh, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := bench.WriteHTML(fh, title, runs); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// progressBar draws on a terminal only; safe for concurrent use.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	name  string
	on    bool
	last  time.Time
	start time.Time
}

func newProgressBar(w io.Writer, name string) *progressBar {
	p := &progressBar{w: w, name: name, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.on = true
		}
	}
	return p
}

// setName names what is in progress.
func (p *progressBar) setName(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.name = name
}

func (p *progressBar) update(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.on || total == 0 || (time.Since(p.last) < 100*time.Millisecond && done < total) {
		return
	}
	p.last = time.Now()
	const width = 30
	n := done * width / total
	fmt.Fprintf(p.w, "\r%-24.24s [%s%s] %d/%d %.0fs", p.name, strings.Repeat("=", n), strings.Repeat(" ", width-n), done, total, time.Since(p.start).Seconds())
}

func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on {
		fmt.Fprintln(p.w)
	}
}
