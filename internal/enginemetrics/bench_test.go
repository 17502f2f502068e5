package enginemetrics

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// benchPayloads: the emulator's exposition as captured (one engine), and
// the same with eight data-parallel engines (every series repeated with
// engine="0".."7"), about the size of a large vLLM deployment's.
func benchPayloads(b *testing.B) map[string][]byte {
	one, err := os.ReadFile("testdata/emulator.txt")
	if err != nil {
		b.Fatal(err)
	}
	var dp8 bytes.Buffer
	for _, line := range strings.Split(string(one), "\n") {
		if !strings.Contains(line, `engine="0"`) {
			dp8.WriteString(line + "\n")
			continue
		}
		for e := range 8 {
			dp8.WriteString(strings.Replace(line, `engine="0"`, `engine="`+string(rune('0'+e))+`"`, 1) + "\n")
		}
	}
	return map[string][]byte{"engine=1": one, "engines=8": dp8.Bytes()}
}

// BenchmarkParse compares this package's parser with the Prometheus
// library's text parser (which builds every family; the baseline any
// expfmt-based scraper would pay before reading a value).
func BenchmarkParse(b *testing.B) {
	for name, data := range benchPayloads(b) {
		b.Run("kvgate/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(bytes.NewReader(data), ""); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("expfmt/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				p := expfmt.NewTextParser(model.LegacyValidation)
				if _, err := p.TextToMetricFamilies(bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
