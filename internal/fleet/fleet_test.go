package fleet

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    Endpoint
		wantErr string
	}{
		{in: "url=http://10.0.0.5:8000,model=m,role=prefill,events=10.0.0.5:5557",
			want: Endpoint{Name: "10.0.0.5:8000", URL: "http://10.0.0.5:8000", Model: "m", Role: RolePrefill, Events: "tcp://10.0.0.5:5557"}},
		{in: "name=a,model=m,replay=tcp://h:1,prefill_speed=20000",
			want: Endpoint{Name: "a", Model: "m", Replay: "tcp://h:1", PrefillSpeed: 20000}},
		{in: "name=a,url=http://h:1/,model=m,role=decode", want: Endpoint{Name: "a", URL: "http://h:1", Model: "m", Role: RoleDecode}},
		{in: "name=a", wantErr: "model is required"},
		{in: "model=m", wantErr: "name= or url="},
		{in: "name=a,model=m,role=leader", wantErr: `unknown role "leader"`},
		{in: "name=a,model=m,color=red", wantErr: `unknown key "color"`},
		{in: "url=ftp://h:1,model=m", wantErr: "must be http"},
		{in: "name=a,model=m,events=ipc:///tmp/x", wantErr: "only tcp://"},
		{in: "name=a,model=m,events=nohost", wantErr: "missing port"},
		{in: "name=a,model=m,prefill_speed=-1", wantErr: "prefill_speed must be in"},
		{in: "name=a,model=m,prefill_speed=NaN", wantErr: "prefill_speed must be in"},
		{in: "name=a,model=m,prefill_speed=fast", wantErr: "not a number"},
		{in: "name=" + strings.Repeat("x", 2000) + ",model=m", wantErr: "longer than"},
	}
	for _, tt := range tests {
		got, err := ParseSpec(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%.60q: error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q:\n got %+v %v\nwant %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseFile(t *testing.T) {
	eps, err := ParseFile([]byte(`
endpoints:
  - {url: "http://a:1", model: m, role: prefill}
  - {name: b, url: "http://b:1", model: m, role: decode, events: "b:5557"}
`))
	if err != nil || len(eps) != 2 || eps[0].Name != "a:1" || eps[1].Role != RoleDecode || eps[1].Events != "tcp://b:5557" {
		t.Fatalf("%+v %v", eps, err)
	}
	for in, want := range map[string]string{
		"endpoints:\n  - {name: a, model: m, colour: red}":             "colour",
		"endpoints:\n  - {name: a, model: m, role: boss}":              "unknown role",
		"endpoints:\n  - {name: a, model: m}\n  - {name: a, model: n}": `endpoints[1]: name "a" already used`,
		"endpoints:\n  - {name: a}":                                    "endpoints[0]: model is required",
		"endpoints: 3":                                                 "cannot unmarshal",
	} {
		if _, err := ParseFile([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
	if eps, err := ParseFile(nil); err != nil || len(eps) != 0 {
		t.Fatalf("empty file: %v %v", eps, err)
	}
}

func TestRoleText(t *testing.T) {
	b, _ := json.Marshal(struct{ R Role }{RolePrefill})
	if string(b) != `{"R":"prefill"}` {
		t.Fatal(string(b))
	}
	var v struct{ R Role }
	if err := json.Unmarshal([]byte(`{"R":"decode"}`), &v); err != nil || v.R != RoleDecode {
		t.Fatal(v, err)
	}
	if err := json.Unmarshal([]byte(`{"R":"x"}`), &v); err == nil {
		t.Fatal("bad role accepted")
	}
	if !RoleBoth.CanPrefill() || !RoleBoth.CanDecode() || RoleDecode.CanPrefill() || RolePrefill.CanDecode() {
		t.Fatal("role capabilities")
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add("url=http://10.0.0.5:8000,model=m,role=prefill,events=10.0.0.5:5557")
	f.Add("name=a,model=m,prefill_speed=1e308")
	f.Add(",,=,")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseSpec(s)
		if err != nil {
			return
		}
		if e.Name == "" || e.Model == "" {
			t.Fatalf("accepted %q without name or model", s)
		}
		if _, err := ParseSpec("name=" + e.Name + ",model=" + e.Model); err != nil && !strings.ContainsAny(e.Name+e.Model, ",=") {
			t.Fatalf("round trip of %q: %v", s, err)
		}
	})
}
