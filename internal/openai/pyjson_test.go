package openai

import (
	"strings"
	"testing"
)

// TestPythonJSON: what Python's json.dumps(json.loads(x)) writes (the
// expected strings are Python 3's, computed once with it).
func TestPythonJSON(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"path":"a.go","n":1.50,"k":2,"s":"é\u00e9 \ud83d\ude00 \"q\" \\ \n\t/\u0001` + "\x7f" + `"}`,
			`{"path": "a.go", "n": 1.5, "k": 2, "s": "\u00e9\u00e9 \ud83d\ude00 \"q\" \\ \n\t/\u0001\u007f"}`},
		{`[1e2,1E-5,0.0001,1e16,1e15,123456789012345.6,-0.0,0.1,1.5e-7,12345678901234567890,-3,2.5E+20,1.7976931348623157e308]`,
			`[100.0, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 123456789012345.6, -0.0, 0.1, 1.5e-07, 12345678901234567890, -3, 2.5e+20, 1.7976931348623157e+308]`},
		{`{"a":1,"b":[true,false,null,{}],"a":2}`, `{"a": 2, "b": [true, false, null, {}]}`},
		{` {} `, `{}`}, {`[]`, `[]`}, {`"x"`, `"x"`},
	} {
		got, err := PythonJSON([]byte(c.in))
		if err != nil || got != c.want {
			t.Errorf("%s:\ngot  %s (%v)\nwant %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `[1,]`, `{} {}`, `{"a" 1}`} {
		if got, err := PythonJSON([]byte(bad)); err == nil {
			t.Errorf("%q: %q", bad, got)
		}
	}
}

func FuzzPythonJSON(f *testing.F) {
	f.Add([]byte(`{"a":[1.5e300,"\u00ff"],"b":{"c":null}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := PythonJSON(in)
		if err == nil && !valid([]byte(out)) && !strings.Contains(out, "Infinity") {
			t.Fatalf("%q -> %q: not JSON", in, out)
		}
	})
}
