package perfmodel

import (
	"math"
	"strings"
	"testing"
)

func TestTimes(t *testing.T) {
	m := Default()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"prefill 20k tokens", m.PrefillTime(20000), 1},
		{"prefill nothing", m.PrefillTime(0), 0},
		{"step of 1", m.DecodeStepTime(1, 1000), 0.010 + 0.00005 + 0.00001},
		{"step of 100", m.DecodeStepTime(100, 200000), 0.010 + 0.005 + 0.002},
		{"empty step", m.DecodeStepTime(0, 0), 0},
		{"transfer", m.TransferTime(400000), 1},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-12 {
			t.Errorf("%s: got %v want %v", tt.name, tt.got, tt.want)
		}
	}
	b := m.MaxBatchForTPOT(0.05, 2000)
	if st := m.DecodeStepTime(b, b*2000); st > 0.05+1e-12 {
		t.Errorf("batch %d step %v exceeds TPOT", b, st)
	}
	if st := m.DecodeStepTime(b+1, (b+1)*2000); st <= 0.05 {
		t.Errorf("batch %d is not the largest: %v", b, st)
	}
	if m.MaxBatchForTPOT(0.005, 1000) != 0 {
		t.Error("TPOT below base step must give 0")
	}
}

func TestValidate(t *testing.T) {
	bad := []Model{{}, {PrefillTokensPerSec: -1, DecodeStepBase: 0.01}, {PrefillTokensPerSec: 1}}
	for i, m := range bad {
		if m.Validate() == nil {
			t.Errorf("case %d: want error", i)
		}
	}
}

// TestValidateRanges: every parameter has a finite range, NaN and Inf
// included, and the error names the parameter as the flags do.
func TestValidateRanges(t *testing.T) {
	tests := []struct {
		mutate func(*Model)
		msg    string
	}{
		{func(m *Model) { m.PrefillTokensPerSec = math.NaN() }, "prefill-speed must be in [1, 1e+09] tokens/s, got NaN"},
		{func(m *Model) { m.PrefillTokensPerSec = 1e-300 }, "prefill-speed"},
		{func(m *Model) { m.PrefillTokensPerSec = math.Inf(1) }, "prefill-speed"},
		{func(m *Model) { m.DecodeStepBase = 1e9 }, "decode-step-base must be in [0, 60] seconds"},
		{func(m *Model) { m.DecodeStepPerSeq = -1 }, "decode-step-per-seq"},
		{func(m *Model) { m.DecodeStepPerKContext = math.Inf(1) }, "decode-step-per-kctx"},
		{func(m *Model) { m.KVTransferTokensPerSec = 1e-300 }, "kv-transfer-speed must be 0 (free) or in [1, 1e+12] tokens/s"},
		{func(m *Model) { m.DecodeStepBase, m.DecodeStepPerSeq = 1e-300, 0 }, "decode step must take some time"},
	}
	for _, tt := range tests {
		m := Default()
		tt.mutate(&m)
		if err := m.Validate(); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("got %v, want %q", err, tt.msg)
		}
	}
	m := Default()
	m.KVTransferTokensPerSec = 0
	if err := m.Validate(); err != nil {
		t.Errorf("0 means free transfer: %v", err)
	}
}
