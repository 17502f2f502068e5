package bench

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"
)

// Run is one run's records and summary, for the report.
type RunResult struct {
	Summary Summary
	Records []Record
}

// palette colours runs in plots.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// plot is an SVG line chart.
type plot struct {
	Title, XLabel, YLabel string
	Series                []series
	LogX                  bool
}

type series struct {
	Name   string
	Colour string
	X, Y   []float64
}

const plotW, plotH, padL, padB, padT, padR = 640.0, 320.0, 60.0, 40.0, 30.0, 260.0

func (p plot) svg() template.HTML {
	var minX, maxX, maxY = math.Inf(1), math.Inf(-1), 0.0
	for _, s := range p.Series {
		for i := range s.X {
			x := p.tx(s.X[i])
			minX, maxX, maxY = math.Min(minX, x), math.Max(maxX, x), math.Max(maxY, s.Y[i])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" class="plot">`, plotW+padR, plotH)
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-weight="bold">%s</text>`, padL, template.HTMLEscapeString(p.Title))
	if math.IsInf(minX, 0) || maxY <= 0 {
		b.WriteString(`<text x="100" y="150">no data</text></svg>`)
		return template.HTML(b.String())
	}
	if maxX == minX {
		maxX = minX + 1
	}
	maxY *= 1.05
	w, h := plotW-padL-10, plotH-padT-padB
	sx := func(x float64) float64 { return padL + (p.tx(x)-minX)/(maxX-minX)*w }
	sy := func(y float64) float64 { return padT + h - y/maxY*h }
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`, padL, padT, w, h)
	for k := 0; k <= 4; k++ {
		y := maxY * float64(k) / 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="11" text-anchor="end">%s</text>`, padL-4, sy(y)+4, short(y))
		fx := minX + (maxX-minX)*float64(k)/4
		if p.LogX {
			fx = math.Pow(10, fx)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="11" text-anchor="middle">%s</text>`, sx(fx), padT+h+16, short(fx))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" text-anchor="middle">%s</text>`, padL+w/2, plotH-4, template.HTMLEscapeString(p.XLabel))
	fmt.Fprintf(&b, `<text x="12" y="%.0f" font-size="12" transform="rotate(-90 12 %.0f)" text-anchor="middle">%s</text>`, padT+h/2, padT+h/2, template.HTMLEscapeString(p.YLabel))
	for i, s := range p.Series {
		var pts strings.Builder
		for j := range s.X {
			fmt.Fprintf(&pts, "%.1f,%.1f ", sx(s.X[j]), sy(s.Y[j]))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"/>`, s.Colour, pts.String())
		fmt.Fprintf(&b, `<rect x="%.0f" y="%d" width="12" height="12" fill="%s"/><text x="%.0f" y="%d" font-size="12">%s</text>`,
			plotW, 40+18*i, s.Colour, plotW+16, 50+18*i, template.HTMLEscapeString(s.Name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func (p plot) tx(x float64) float64 {
	if p.LogX {
		return math.Log10(math.Max(x, 1e-6))
	}
	return x
}

func short(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 0.1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// cdf is the empirical distribution of xs as (value, fraction) points.
func cdf(xs []float64) ([]float64, []float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	step := max(1, n/200)
	var x, y []float64
	for i := 0; i < n; i += step {
		x, y = append(x, s[i]), append(y, float64(i+1)/float64(n))
	}
	if n > 0 {
		x, y = append(x, s[n-1]), append(y, 1)
	}
	return x, y
}

// throughput is completed requests per second over time, in bins.
func throughput(recs []Record, duration float64) ([]float64, []float64) {
	if duration <= 0 {
		return nil, nil
	}
	bins := 40
	w := duration / float64(bins)
	counts := make([]float64, bins)
	for _, r := range recs {
		if r.Outcome != "ok" {
			continue
		}
		// E2E counts from when the request was due, Late before Sent.
		b := int((r.Sent - r.Late + r.E2E) / w)
		if b >= 0 && b < bins {
			counts[b]++
		}
	}
	x := make([]float64, bins)
	for i := range counts {
		x[i] = (float64(i) + 0.5) * w
		counts[i] /= w
	}
	return x, counts
}

func (r RunResult) values(f func(*Record) (float64, bool)) []float64 {
	var out []float64
	for i := range r.Records {
		if v, ok := f(&r.Records[i]); ok {
			out = append(out, v)
		}
	}
	return out
}

// WriteHTML writes a self-contained page: the summary table and plots
// (TTFT and TPOT distributions, throughput over time, and attainment
// against offered rate when runs have rates).
func WriteHTML(w io.Writer, title string, runs []RunResult) error {
	var ttft, tpot, thr plot
	ttft = plot{Title: "TTFT distribution", XLabel: "TTFT (s, log scale)", YLabel: "fraction of requests", LogX: true}
	tpot = plot{Title: "TPOT distribution", XLabel: "TPOT (s)", YLabel: "fraction of requests"}
	thr = plot{Title: "Throughput over time", XLabel: "time (s)", YLabel: "completed requests/s"}
	att := plot{Title: "SLO attainment against offered rate", XLabel: "rate (req/s)", YLabel: "attainment"}
	byLabel := map[string]*series{}
	var order []string
	for i, r := range runs {
		c := palette[i%len(palette)]
		name := r.Summary.Label
		x, y := cdf(r.values(func(x *Record) (float64, bool) { return x.TTFT, x.Outcome == "ok" }))
		ttft.Series = append(ttft.Series, series{name, c, x, y})
		x, y = cdf(r.values(func(x *Record) (float64, bool) {
			return x.TPOT, x.Outcome == "ok" && x.OutputTokens > 1 && !x.Unstreamed
		}))
		tpot.Series = append(tpot.Series, series{name, c, x, y})
		x, y = throughput(r.Records, r.Summary.Duration)
		thr.Series = append(thr.Series, series{name, c, x, y})
		if r.Summary.Rate > 0 && !r.Summary.Interrupted {
			// An interrupted rung is not comparable (its cut requests are
			// misses): it drew a cliff in the ladder.
			base := strings.TrimSuffix(name, fmt.Sprintf(" @%g", r.Summary.Rate))
			s := byLabel[base]
			if s == nil {
				s = &series{Name: base, Colour: palette[len(order)%len(palette)]}
				byLabel[base] = s
				order = append(order, base)
			}
			s.X, s.Y = append(s.X, r.Summary.Rate), append(s.Y, r.Summary.Attainment)
		}
	}
	plots := []template.HTML{ttft.svg(), tpot.svg(), thr.svg()}
	ladder := false
	for _, b := range order {
		if len(byLabel[b].X) > 1 {
			ladder = true
		}
		att.Series = append(att.Series, *byLabel[b])
	}
	if ladder {
		plots = append(plots, att.svg())
	}
	var table strings.Builder
	ss := make([]Summary, len(runs))
	for i, r := range runs {
		ss[i] = r.Summary
	}
	if err := WriteTable(&table, ss); err != nil {
		return err
	}
	return reportTmpl.Execute(w, map[string]any{"Title": title, "Table": table.String(), "Plots": plots})
}

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1100px} pre{background:#f6f6f6;padding:1em;overflow-x:auto} svg.plot{display:block;margin:1.5em 0}</style>
</head><body>
<h1>{{.Title}}</h1>
<pre id="summary">{{.Table}}</pre>
{{range .Plots}}{{.}}
{{end}}
<p>Generated by kvgate bench. Attainment counts every request sent: rejected (429), failed and unsent requests are misses; latencies are over served requests.</p>
</body></html>
`))
