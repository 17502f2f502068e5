package flagrange

import (
	"errors"
	"flag"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	dur := Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds"}
	if err := dur.Check("--duration", 1e12); err == nil || err.Error() != "--duration must be in [0.001, 86400] seconds, got 1e+12" {
		t.Fatalf("got %v", err)
	}
	for _, v := range []float64{0.001, 1, 86400} {
		if err := dur.Check("d", v); err != nil {
			t.Errorf("%v: %v", v, err)
		}
	}
	for _, v := range []float64{0, -1, 0.0009, 86400.5, math.NaN(), math.Inf(1), math.Inf(-1), 5e-324} {
		if err := dur.Check("d", v); err == nil {
			t.Errorf("%v accepted", v)
		}
	}
	slo := Range[float64]{Min: 0.001, Max: 3600, Unit: "seconds", Zero: "none"}
	if err := slo.Check("slo", 0); err != nil {
		t.Errorf("0 means none: %v", err)
	}
	err := slo.Check("--slo-ttft", -1)
	var re *Error
	if !errors.As(err, &re) || re.Name != "--slo-ttft" || err.Error() != "--slo-ttft must be 0 (none) or in [0.001, 3600] seconds, got -1" {
		t.Errorf("got %v", err)
	}
	blocks := Range[int]{Min: 1, Max: 1 << 22, Unit: "blocks"}
	if err := blocks.Check("num-gpu-blocks", 1<<62); err == nil || !strings.Contains(err.Error(), "[1, 4194304] blocks, got 4611686018427387904") {
		t.Errorf("got %v", err)
	}
	ttl := Range[time.Duration]{Min: time.Millisecond, Max: time.Hour}
	if err := ttl.Check("ttl", 2*time.Hour); err == nil || err.Error() != "ttl must be in [1ms, 1h0m0s], got 2h0m0s" {
		t.Errorf("got %v", err)
	}
}

func TestFlags(t *testing.T) {
	type vals struct {
		n   int
		f   float64
		d   time.Duration
		n64 int64
	}
	newSet := func(v *vals) (*flag.FlagSet, *Flags) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fl := New(fs)
		*v = vals{n: 8, f: 2, d: time.Second, n64: 5}
		Var(fl, &v.n, "n", Range[int]{Min: 1, Max: 4096}, "instances")
		Var(fl, &v.f, "f", Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds"}, "duration")
		Var(fl, &v.d, "d", Range[time.Duration]{Min: 0, Max: time.Minute}, "timeout")
		Var(fl, &v.n64, "n64", Range[int64]{Min: 0, Max: 10}, "count")
		return fs, fl
	}
	var v vals
	fs, fl := newSet(&v)
	if err := fs.Parse(nil); err != nil || fl.Check() != nil {
		t.Fatalf("defaults: %v %v", err, fl.Check())
	}
	if u := fs.Lookup("n").Usage; u != "instances (in [1, 4096])" {
		t.Errorf("usage %q", u)
	}
	if d := fs.Lookup("d").DefValue; d != "1s" {
		t.Errorf("default shown as %q", d)
	}
	if err := fs.Parse([]string{"--n", "2e3", "--f", "0.5", "--d", "30s", "--n64", "7"}); err != nil || fl.Check() != nil {
		t.Fatalf("%v %v", err, fl.Check())
	}
	if v != (vals{n: 2000, f: 0.5, d: 30 * time.Second, n64: 7}) {
		t.Errorf("parsed %+v", v)
	}

	bad := []struct {
		args []string
		msg  string // in the parse error, or else in Check's
	}{
		{[]string{"--n", "1e8"}, "--n must be in [1, 4096], got 100000000"},
		{[]string{"--n", "0"}, "--n must be in [1, 4096], got 0"},
		{[]string{"--n", "2.5"}, `invalid value "2.5" for flag -n: want a number in [1, 4096]`},
		{[]string{"--n", "1e30"}, `invalid value "1e30" for flag -n: want a number in [1, 4096]`},
		{[]string{"--n", "99999999999999999999"}, "want a number in [1, 4096]"},
		{[]string{"--f", "NaN"}, "--f must be in [0.001, 86400] seconds, got NaN"},
		{[]string{"--f", "Inf"}, "--f must be in [0.001, 86400] seconds, got +Inf"},
		{[]string{"--f", "1e-320"}, "got 1e-320"},
		{[]string{"--f", "ten"}, "want a number in [0.001, 86400] seconds"},
		{[]string{"--d", "5"}, `invalid value "5" for flag -d: want a duration with its unit (1.5s, 300ms, 2m) in [0s, 1m0s]`},
		{[]string{"--d", "2m"}, "--d must be in [0s, 1m0s], got 2m0s"},
		{[]string{"--d", "-1s"}, "--d must be in [0s, 1m0s], got -1s"},
		{[]string{"--n64", "11"}, "--n64 must be in [0, 10], got 11"},
	}
	for _, b := range bad {
		fs, fl := newSet(&v)
		err := fs.Parse(b.args)
		if err == nil {
			err = fl.Check()
		}
		if err == nil || !strings.Contains(err.Error(), b.msg) {
			t.Errorf("%v: got %v, want %q", b.args, err, b.msg)
		}
	}
	// Every flag out of range is reported, not only the first.
	fs, fl = newSet(&v)
	if err := fs.Parse([]string{"--n", "0", "--f", "0"}); err != nil {
		t.Fatal(err)
	}
	if err := fl.Check(); err == nil || !strings.Contains(err.Error(), "--n ") || !strings.Contains(err.Error(), "--f ") {
		t.Errorf("want both flags named: %v", err)
	}
}
