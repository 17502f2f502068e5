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
// them); JSON null when none did, never a measured-looking 0.
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
var Outcomes = []string{"ok", "rejected", "client_error", "server_error", "transport", "not_sent"}

// Summary is a run's result.
type Summary struct {
	Label    string  `json:"label,omitempty"`
	Rate     float64 `json:"rate,omitempty"` // offered, requests/s (open loop)
	Requests int     `json:"requests"`
	Duration float64 `json:"duration"` // seconds (scaled)
	SLO      SLO     `json:"slo"`
	// Unstreamed: the requests were sent unstreamed (--no-stream): TTFT
	// is each answer's arrival, there is no TPOT.
	Unstreamed bool `json:"unstreamed,omitempty"`
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
}

func pct(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(int(q*float64(len(s))), len(s)-1)] }
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Percentiles{N: len(s), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

// Met reports whether a record meets the SLO.
func (s SLO) Met(r *Record) bool {
	return r.Outcome == "ok" && (s.TTFT <= 0 || r.TTFT <= s.TTFT) && (s.TPOT <= 0 || r.OutputTokens < 2 || r.TPOT <= s.TPOT)
}

// Summarize computes a run's summary; duration is the run's length in
// reported (scaled) seconds.
func Summarize(label string, recs []Record, duration float64, slo SLO) Summary {
	s := Summary{Label: label, Requests: len(recs), Duration: duration, SLO: slo, Outcomes: map[string]int{}}
	for _, o := range Outcomes {
		s.Outcomes[o] = 0
	}
	var ttft, tpot, itl, e2e []float64
	good, out := 0, 0
	var prompt, cached int64
	// A server that reports cache hits in some answers leaves them out
	// of others when none were cached (vLLM's chat does): those are 0.
	// One that reports none (vLLM without --enable-prompt-tokens-details,
	// its Messages API) has no hit rate.
	reports := slices.ContainsFunc(recs, func(r Record) bool { return r.Outcome == "ok" && r.CachedTokens >= 0 })
	for i := range recs {
		r := &recs[i]
		s.Outcomes[r.Outcome]++
		if r.Outcome != "ok" {
			continue
		}
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		if r.OutputTokens > 1 {
			tpot = append(tpot, r.TPOT)
			itl = append(itl, r.MeanITL)
		}
		out += r.OutputTokens
		if reports {
			prompt += int64(r.PromptTokens)
			cached += int64(max(r.CachedTokens, 0))
		}
		if slo.Met(r) {
			good++
		}
	}
	s.TTFT, s.TPOT, s.ITL, s.E2E = pct(ttft), pct(tpot), pct(itl), pct(e2e)
	if len(recs) > 0 {
		s.Attainment = float64(good) / float64(len(recs))
		s.Rejected = float64(s.Outcomes["rejected"]) / float64(len(recs))
	}
	if duration > 0 {
		s.Goodput = float64(good) / duration
		s.Throughput = float64(s.Outcomes["ok"]) / duration
		s.TokensPerSec = float64(out) / duration
	}
	if s.HitRate = -1; prompt > 0 { // -1: nothing served, or no answer said what it found cached
		s.HitRate = float64(cached) / float64(prompt)
	}
	return s
}

// WriteTable writes summaries as an aligned table.
func WriteTable(w io.Writer, ss []Summary) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\trequests\tok\trejected\terrors\thit\tTTFT p50\tTTFT p99\tTPOT p50\tTPOT p99\tattain\tgoodput\ttok/s\t")
	for _, s := range ss {
		errs := s.Requests - s.Outcomes["ok"] - s.Outcomes["rejected"]
		hit := fmt.Sprintf("%.1f%%", 100*s.HitRate)
		if s.HitRate < 0 {
			hit = "-"
		}
		// Latencies of no answer are unknown, not zero.
		ttft50, ttft99, tpot50, tpot99 := "-", "-", "-", "-"
		if s.Outcomes["ok"] > 0 {
			ttft50, ttft99 = fmt.Sprintf("%.3fs", s.TTFT.P50), fmt.Sprintf("%.3fs", s.TTFT.P99)
			if !s.Unstreamed {
				tpot50, tpot99 = fmt.Sprintf("%.4fs", s.TPOT.P50), fmt.Sprintf("%.4fs", s.TPOT.P99)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.2f/s\t%.0f\t\n",
			s.Label, s.Requests, s.Outcomes["ok"], 100*s.Rejected, errs, hit, ttft50, ttft99,
			tpot50, tpot99, 100*s.Attainment, s.Goodput, s.TokensPerSec)
	}
	return tw.Flush()
}

// WriteCSV writes one line per request.
func WriteCSV(w io.Writer, runs []RunResult) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"run", "index", "session", "sent", "status", "outcome", "ttft", "tpot", "mean_itl", "max_itl", "e2e",
		"prompt_tokens", "cached_tokens", "output_tokens", "endpoint", "predicted_ttft", "held", "predicted_cached", "error"})
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 6, 64) }
	for _, run := range runs {
		for _, r := range run.Records {
			_ = cw.Write([]string{run.Summary.Label, strconv.Itoa(r.Index), strconv.Itoa(r.Session), f(r.Sent), strconv.Itoa(r.Status), r.Outcome,
				f(r.TTFT), f(r.TPOT), f(r.MeanITL), f(r.MaxITL), f(r.E2E), strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CachedTokens),
				strconv.Itoa(r.OutputTokens), r.Endpoint, f(r.PredictedTTFT), f(r.Held), strconv.Itoa(r.PredictedCached), r.Error})
		}
	}
	cw.Flush()
	return cw.Error()
}
