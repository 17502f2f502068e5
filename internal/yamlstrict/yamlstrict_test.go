package yamlstrict

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	type inner struct {
		Rate float64 `yaml:"rate"`
	}
	type doc struct {
		Name   string  `yaml:"name"`
		Phases []inner `yaml:"phases"`
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
		{"name: [1, 2]\n", "cannot unmarshal", ""},
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
