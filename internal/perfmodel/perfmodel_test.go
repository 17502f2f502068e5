package perfmodel

import (
	"math"
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
