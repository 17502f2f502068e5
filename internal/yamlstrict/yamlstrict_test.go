package yamlstrict

import (
	"strings"
	"testing"
	"time"
)

func TestDecode(t *testing.T) {
	type inner struct {
		Rate float64 `yaml:"rate"`
		N    int     `yaml:"n"`
	}
	type doc struct {
		Name    string         `yaml:"name"`
		Phases  []inner        `yaml:"phases"`
		Max     int            `yaml:"max"`
		Wait    time.Duration  `yaml:"wait"`
		ByName  map[string]int `yaml:"by_name"`
		Pointer *inner         `yaml:"pointer"`
	}
	for _, tc := range []struct {
		in   string
		want string // in the error; "" for none
		no   string // not in the error
	}{
		{"name: a\nphases:\n  - rate: 3\n", "", ""},
		{"", "", ""},
		{"name: a\nbogus: 1\n", "line 2: bogus is not a setting here", "yamlstrict"},
		{"phases:\n  - rate: 3\n    rat: 4\n", "line 3: rat is not a setting here", "inner"},
		{"name: [1, 2]\n", "line 1: name: a list where a single value belongs", ""},
		// What yaml.v3 took in silence or named in Go's terms (a
		// walkthrough of 2026-12-04: max_inflight: 1.9 ran with 1).
		{"max: 1.9\n", "line 1: max: 1.9 is not an integer", ""},
		{"phases:\n  - n: 2.5\n", "line 2: phases[0].n: 2.5 is not an integer", ""},
		{"by_name: {a: 0.5}\n", "by_name.a: 0.5 is not an integer", ""},
		{"pointer: {n: 1e3}\n", "pointer.n: 1e3 is not an integer", ""},
		{"wait: 5\n", "line 1: wait: 5 needs its unit", "time.Duration"},
		{"wait: 1.5\n", "wait: 1.5 needs its unit", ""},
		{"wait: 0s\nmax: 3\nphases:\n  - {rate: 1.5, n: 2}\n", "", ""},
		{"wait: 5s\n", "", ""},
		{"phases: {rate: 1}\n", "phases: a mapping where a list belongs", ""},
		{"- 1\n- 2\n", "a list where a mapping of settings belongs", "yamlstrict"},
		{"name: a\n---\nbogus: 1\n", "line 2: a second YAML document", ""},
		{"name: a\n---\n", "a second YAML document", ""},
		{"name: a\n  bad indent: [\n", "yaml:", ""},
	} {
		var d doc
		err := Decode([]byte(tc.in), &d)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want %q", tc.in, err, tc.want)
		case tc.no != "" && err != nil && strings.Contains(err.Error(), tc.no):
			t.Errorf("%q: %v names a Go type", tc.in, err)
		}
	}
}
