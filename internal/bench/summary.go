package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
)

// SLO is the targets a request must meet to count toward goodput
// (seconds; 0: none).
type SLO struct {
	TTFT float64 `json:"ttft"`
	TPOT float64 `json:"tpot"`
}

// Percentiles of one latency over the requests that produced it (N of
// them; for the inter-token latency, N gaps between chunks); JSON null
// when none did, never a measured-looking 0.
type Percentiles struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// MarshalJSON writes null for no sample.
func (p Percentiles) MarshalJSON() ([]byte, error) {
	if p.N == 0 {
		return []byte("null"), nil
	}
	type plain Percentiles
	return json.Marshal(plain(p))
}

// Outcomes is every outcome a request can have, each counted in
// Summary.Outcomes (0 included).
var Outcomes = []string{"ok", "rejected", "client_error", "server_error", "transport", "timeout", "interrupted", "not_sent"}

// Summary is a run's result.
type Summary struct {
	Label    string  `json:"label,omitempty"`
	Rate     float64 `json:"rate,omitempty"` // offered, requests/s (open loop)
	Requests int     `json:"requests"`
	Duration float64 `json:"duration"` // seconds (scaled)
	SLO      SLO     `json:"slo"`
	// Unstreamed: the requests were sent unstreamed (--no-stream): TTFT
	// is each answer's arrival, there is no TPOT nor inter-token latency.
	Unstreamed bool `json:"unstreamed,omitempty"`
	// Interrupted: the run was stopped (its context ended: Ctrl-C)
	// before it sent and finished every request; its numbers are those
	// of the part that ran.
	Interrupted bool `json:"interrupted,omitempty"`
	// Attainment counts every request sent: rejected, failed and unsent
	// ones are misses.
	Attainment   float64        `json:"attainment"`
	Goodput      float64        `json:"goodput"` // requests meeting the SLO per second
	Throughput   float64        `json:"throughput"`
	TokensPerSec float64        `json:"output_tokens_per_sec"`
	HitRate      float64        `json:"hit_rate"` // cached / prompt tokens, from the server's usage; -1 when no answer said (none served, or the Messages API)
	Rejected     float64        `json:"rejected"` // share answered 429
	Outcomes     map[string]int `json:"outcomes"`
	TTFT         Percentiles    `json:"ttft"`
	TPOT         Percentiles    `json:"tpot"`
	ITL          Percentiles    `json:"itl"`
	E2E          Percentiles    `json:"e2e"`
	// RejectedWait is how long the rejected (429) requests waited for
	// their answer, from when they were due: an early rejection is an
	// answer at once, or after a wait at the router or in a queue.
	RejectedWait Percentiles `json:"rejected_wait"`
}

// pct is xs's percentiles as numpy's percentile computes them, as vLLM's
// benchmark reports them: the q-th is at position q·(n−1) of the sorted
// values, interpolated linearly between the two closest ranks (the p50 of
// 1, 2, 3, 4 is 2.5; the p99 of 1…100 is 99.01, not the maximum).
func pct(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	at := func(q float64) float64 {
		pos := q * float64(len(s)-1)
		i := int(pos)
		if i+1 >= len(s) {
			return s[len(s)-1]
		}
		return s[i] + (pos-float64(i))*(s[i+1]-s[i])
	}
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Percentiles{N: len(s), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

// Met reports whether a record meets the SLO. An unstreamed answer has no
// TPOT: it cannot be shown to meet a TPOT target, and misses it (kvgate
// bench refuses the two together).
func (s SLO) Met(r *Record) bool {
	tpot := s.TPOT <= 0 || r.OutputTokens < 2 || !r.Unstreamed && r.TPOT <= s.TPOT
	return r.Outcome == "ok" && (s.TTFT <= 0 || r.TTFT <= s.TTFT) && tpot
}

// Summarize computes a run's summary; duration is the run's length in
// reported (scaled) seconds.
func Summarize(label string, recs []Record, duration float64, slo SLO) Summary {
	s := Summary{Label: label, Requests: len(recs), Duration: duration, SLO: slo, Outcomes: map[string]int{}}
	for _, o := range Outcomes {
		s.Outcomes[o] = 0
	}
	var ok []*Record
	var waits []float64
	good, out := 0, 0
	for i := range recs {
		r := &recs[i]
		s.Outcomes[r.Outcome]++
		if r.Outcome == "rejected" {
			waits = append(waits, r.E2E)
		}
		if r.Outcome != "ok" {
			continue
		}
		ok = append(ok, r)
		out += r.OutputTokens
		s.Unstreamed = s.Unstreamed || r.Unstreamed
		if slo.Met(r) {
			good++
		}
	}
	s.TTFT, s.TPOT, s.ITL, s.E2E = latencies(ok)
	s.RejectedWait = pct(waits)
	if len(recs) > 0 {
		s.Attainment = float64(good) / float64(len(recs))
		s.Rejected = float64(s.Outcomes["rejected"]) / float64(len(recs))
	}
	if duration > 0 {
		s.Goodput = float64(good) / duration
		s.Throughput = float64(s.Outcomes["ok"]) / duration
		s.TokensPerSec = float64(out) / duration
	}
	s.HitRate = hitRate(ok)
	return s
}

// latencies is the percentiles of served records' TTFT, TPOT, inter-token
// latency (over every gap, itl.go) and end-to-end latency. An unstreamed
// answer has a TTFT (its arrival) but no TPOT nor gaps: counted as 0 they
// looked measured.
func latencies(ok []*Record) (ttft, tpot, itl, e2e Percentiles) {
	var t, p, e []float64
	for _, r := range ok {
		t, e = append(t, r.TTFT), append(e, r.E2E)
		if r.OutputTokens > 1 && !r.Unstreamed {
			p = append(p, r.TPOT)
		}
	}
	return pct(t), pct(p), itlPercentiles(ok), pct(e)
}

// hitRate is cached / prompt tokens over served records, -1 when none
// said. A server that reports cache hits in some answers leaves them out
// of others when none were cached (vLLM's chat does): those are 0. One
// that reports none (vLLM without --enable-prompt-tokens-details, its
// Messages API) has no hit rate.
func hitRate(ok []*Record) float64 {
	if !slices.ContainsFunc(ok, func(r *Record) bool { return r.CachedTokens >= 0 }) {
		return -1
	}
	var prompt, cached int64
	for _, r := range ok {
		prompt += int64(r.PromptTokens)
		cached += int64(max(r.CachedTokens, 0))
	}
	if prompt == 0 {
		return -1
	}
	return float64(cached) / float64(prompt)
}

// WriteTable writes summaries as an aligned table: errors are the
// requests that failed (neither served, rejected, unsent nor cut by the
// run's stop), unsent those a stopped run never sent; then a line for each
// interrupted run.
func WriteTable(w io.Writer, ss []Summary) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\trequests\tok\trejected\terrors\tunsent\thit\tTTFT p50\tTTFT p99\tTPOT p50\tTPOT p99\tattain\tgoodput\ttok/s\t")
	for _, s := range ss {
		unsent := s.Outcomes["not_sent"]
		errs := s.Requests - s.Outcomes["ok"] - s.Outcomes["rejected"] - unsent - s.Outcomes["interrupted"]
		hit := fmt.Sprintf("%.1f%%", 100*s.HitRate)
		if s.HitRate < 0 {
			hit = "-"
		}
		// Latencies of no answer (and an unstreamed run's TPOT) are
		// unknown, not zero.
		ttft50, ttft99 := cell(s.TTFT, s.TTFT.P50, "%.3fs"), cell(s.TTFT, s.TTFT.P99, "%.3fs")
		tpot50, tpot99 := cell(s.TPOT, s.TPOT.P50, "%.4fs"), cell(s.TPOT, s.TPOT.P99, "%.4fs")
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.2f/s\t%.0f\t\n",
			s.Label, s.Requests, s.Outcomes["ok"], 100*s.Rejected, errs, unsent, hit, ttft50, ttft99,
			tpot50, tpot99, 100*s.Attainment, s.Goodput, s.TokensPerSec)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range ss {
		if rw := s.RejectedWait; rw.N > 0 {
			fmt.Fprintf(w, "%s: its %d rejections (429) were answered %.3f s after they were due at the median, %.3f s at p99 (at most %.3f s)\n",
				s.Label, rw.N, rw.P50, rw.P99, rw.Max)
		}
		if s.Interrupted {
			fmt.Fprintf(w, "%s: interrupted after %.1f s: its numbers are those of the part that ran (%d requests not sent, %d cut in flight; both count as misses)\n",
				s.Label, s.Duration, s.Outcomes["not_sent"], s.Outcomes["interrupted"])
		}
	}
	return nil
}

// cell is v, one of p's values, in format f; "-" when p has no sample.
func cell(p Percentiles, v float64, f string) string {
	if p.N == 0 {
		return "-"
	}
	return fmt.Sprintf(f, v)
}

// orUnknown is x as the CSV writes a float, or -1 when unknown (an
// unstreamed answer's TPOT and gaps: they were written as 0).
func orUnknown(x float64, unknown bool) string {
	if unknown {
		return "-1"
	}
	return strconv.FormatFloat(x, 'f', 6, 64)
}

// WriteCSV writes one line per request.
func WriteCSV(w io.Writer, runs []RunResult) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"run", "index", "session", "sent", "status", "outcome", "ttft", "tpot", "mean_itl", "max_itl", "e2e",
		"prompt_tokens", "cached_tokens", "output_tokens", "endpoint", "predicted_ttft", "held", "predicted_cached", "late", "error"})
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 6, 64) }
	for _, run := range runs {
		for _, r := range run.Records {
			_ = cw.Write([]string{run.Summary.Label, strconv.Itoa(r.Index), strconv.Itoa(r.Session), f(r.Sent), strconv.Itoa(r.Status), r.Outcome,
				f(r.TTFT), orUnknown(r.TPOT, r.Unstreamed), orUnknown(r.MeanITL, r.Unstreamed), orUnknown(r.MaxITL, r.Unstreamed), f(r.E2E), strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CachedTokens),
				strconv.Itoa(r.OutputTokens), r.Endpoint, f(r.PredictedTTFT), f(r.Held), strconv.Itoa(r.PredictedCached), f(r.Late), r.Error})
		}
	}
	cw.Flush()
	return cw.Error()
}
