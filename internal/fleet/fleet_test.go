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
		{in: "url=http://h:1,model=m,dp_size=4", want: Endpoint{Name: "h:1", URL: "http://h:1", Model: "m", DPSize: 4}},
		{in: "name=a,model=m,dp_size=two", wantErr: "not an integer"},
		{in: "url=http://h:1,model=m,role=prefill,bootstrap_port=8998", want: Endpoint{Name: "h:1", URL: "http://h:1", Model: "m", Role: RolePrefill, BootstrapPort: 8998}},
		{in: "name=a,model=m,role=decode,bootstrap_port=8998", wantErr: "role=prefill"},
		{in: "name=a,model=m,bootstrap_port=8998", wantErr: "role=prefill"},
		{in: "name=a,model=m,role=prefill,bootstrap_port=70000", wantErr: "port number"},
		{in: "name=a,model=m,role=prefill,bootstrap_port=x", wantErr: "not an integer"},
		{in: "name=a,model=m,dp_size=-1", wantErr: "dp_size must be in"},
		{in: "name=a,model=m,dp_size=1025", wantErr: "dp_size must be in"},
		{in: "name=a,model=m,lora=sql,lora=chat", want: Endpoint{Name: "a", Model: "m", LoRA: []string{"sql", "chat"}}},
		{in: "name=a,model=m,lora=", wantErr: "an adapter's name must be 1 to 256 bytes"},
		{in: "name=a,model=m,lora=" + strings.Repeat("x", 257), wantErr: "an adapter's name must be 1 to 256 bytes"},
		{in: "name=a,model=m,lora=m", wantErr: "base model's name"},
		{in: "name=a,model=m,lora=x,lora=x", wantErr: `adapter "x" is listed twice`},
		{in: "name=a,model=m" + strings.Repeat(",lora=x", MaxLoRA+1), wantErr: "at most 1024"},
	}
	for _, tt := range tests {
		got, err := ParseSpec(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%.60q: error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !got.Equal(tt.want) {
			t.Errorf("%q:\n got %+v %v\nwant %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseFile(t *testing.T) {
	eps, err := ParseFile([]byte(`
endpoints:
  - {url: "http://a:1", model: m, role: prefill}
  - {name: b, url: "http://b:1", model: m, role: decode, events: "b:5557", lora: [sql, chat]}
`))
	if err != nil || len(eps) != 2 || eps[0].Name != "a:1" || eps[1].Role != RoleDecode || eps[1].Events != "tcp://b:5557" || !eps[1].Serves("chat") {
		t.Fatalf("%+v %v", eps, err)
	}
	for in, want := range map[string]string{
		"endpoints:\n  - {name: a, model: m, colour: red}":             "colour",
		"endpoints:\n  - {name: a, model: m, role: boss}":              "unknown role",
		"endpoints:\n  - {name: a, model: m}\n  - {name: a, model: n}": `endpoints[1]: name "a" already used`,
		"endpoints:\n  - {name: a}":                                    "endpoints[0]: model is required",
		"endpoints: 3":                                                 "endpoints: \"3\" where a list belongs",
		"endpoints:\n  - {name: a, model: m, lora: [m]}":               "base model's name",
	} {
		if _, err := ParseFile([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
	if eps, err := ParseFile(nil); err != nil || len(eps) != 0 {
		t.Fatalf("empty file: %v %v", eps, err)
	}
}

// TestDataParallelRanks: an engine of dp_size N becomes N endpoints, one
// a rank, named NAME/dpR, their KV-event sockets at the port + R (as vLLM
// and SGLang offset them); validating the result again changes nothing.
func TestDataParallelRanks(t *testing.T) {
	eps, err := ParseFile([]byte(`
endpoints:
  - {url: "http://a:8000", model: m, dp_size: 3, events: "a:5557", replay: "tcp://a:6000"}
  - {name: b, url: "http://b:8000", model: m, dp_size: 2}
  - {name: c, url: "http://c:8000", model: m, dp_size: 1, events: "c:5557"}
`))
	if err != nil {
		t.Fatal(err)
	}
	type rank struct {
		name, events, replay string
		rank                 int
		ranked               bool
	}
	want := []rank{
		{"a:8000/dp0", "tcp://a:5557", "tcp://a:6000", 0, true},
		{"a:8000/dp1", "tcp://a:5558", "tcp://a:6001", 1, true},
		{"a:8000/dp2", "tcp://a:5559", "tcp://a:6002", 2, true},
		{"b/dp0", "", "", 0, true},
		{"b/dp1", "", "", 1, true},
		{"c", "tcp://c:5557", "", 0, false},
	}
	check := func(eps []Endpoint) {
		t.Helper()
		if len(eps) != len(want) {
			t.Fatalf("%d endpoints, want %d: %+v", len(eps), len(want), eps)
		}
		for i, e := range eps {
			got := rank{e.Name, e.Events, e.Replay, e.DPRank, e.Ranked()}
			if got != want[i] || e.URL == "" || e.Model != "m" {
				t.Errorf("endpoint %d: %+v, want %+v", i, e, want[i])
			}
		}
	}
	check(eps)
	again, err := Validate(eps)
	if err != nil {
		t.Fatal(err)
	}
	check(again)
	for in, msg := range map[string]string{
		"endpoints:\n  - {name: a, model: m, dp_size: 2, events: \"a:65535\"}":         "rank 1's port",
		"endpoints:\n  - {name: a, model: m, dp_size: 2}\n  - {name: a/dp1, model: m}": `name "a/dp1" already used`,
		"endpoints:\n  - {name: a, model: m, dp_size: 1025}":                           "dp_size must be in",
		"endpoints:\n  - {name: a, model: m, dp_size: 1024}\n  - {name: b, model: m, dp_size: 1024}\n  - {name: c, model: m, dp_size: 1024}\n  - {name: d, model: m, dp_size: 1024}\n  - {name: e, model: m}": "more than 4096 endpoints",
		"endpoints:\n  - {name: a, model: m, dp_rank: 1}": "dp_rank",
	} {
		if _, err := ParseFile([]byte(in)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", in, err, msg)
		}
	}
}

func TestCheckCentralMode(t *testing.T) {
	ranks, err := Validate([]Endpoint{{Name: "a", Model: "m", DPSize: 2}})
	if err != nil {
		t.Fatal(err)
	}
	withEvents, err := Validate([]Endpoint{{Name: "a", Model: "m", DPSize: 2, Events: "a:5557"}})
	if err != nil {
		t.Fatal(err)
	}
	plain := []Endpoint{{Name: "b", Model: "m"}}
	for _, tt := range []struct {
		name, bind string
		ranks      int
		eps        []Endpoint
		ok         bool
	}{
		{"ranks, per-engine mode", "", 1, ranks, true},
		{"rank ports without central mode", "", 2, plain, false},
		{"ranks without events, central mode, one port", "tcp://0.0.0.0:5557", 1, ranks, false},
		{"ranks without events, central mode, a port a rank", "tcp://0.0.0.0:5557", 2, ranks, true},
		{"ranks with events, central mode", "tcp://0.0.0.0:5557", 1, withEvents, true},
		{"no ranks, central mode", "tcp://0.0.0.0:5557", 1, plain, true},
	} {
		if err := CheckCentralMode(tt.bind, tt.ranks, tt.eps); (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
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

func TestValidateAdapters(t *testing.T) {
	tests := []struct {
		name    string
		eps     []Endpoint
		wantErr string
	}{
		{name: "one base per adapter, shared by its endpoints", eps: []Endpoint{
			{Name: "a", Model: "m", LoRA: []string{"sql"}}, {Name: "b", Model: "m", LoRA: []string{"sql", "chat"}}, {Name: "c", Model: "n"}}},
		{name: "an adapter of two models", eps: []Endpoint{
			{Name: "a", Model: "m", LoRA: []string{"sql"}}, {Name: "b", Model: "n", LoRA: []string{"sql"}}},
			wantErr: `LoRA adapter "sql" is also declared on model "m"`},
		{name: "an adapter that is a model elsewhere", eps: []Endpoint{
			{Name: "a", Model: "m", LoRA: []string{"n"}}, {Name: "b", Model: "n"}},
			wantErr: `its model "n" is a LoRA adapter of model "m"`},
		{name: "a data-parallel engine's ranks all serve its adapters", eps: []Endpoint{
			{Name: "a", Model: "m", LoRA: []string{"sql"}, DPSize: 2}}},
	}
	for _, tt := range tests {
		got, err := Validate(tt.eps)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		for _, e := range got {
			if !e.Serves(e.Model) || len(tt.eps) == 1 && !e.Serves("sql") || e.Serves("other") {
				t.Errorf("%s: %s serves %v", tt.name, e.Name, e.LoRA)
			}
		}
	}
}

func TestEndpointEqual(t *testing.T) {
	a := Endpoint{Name: "a", Model: "m", LoRA: []string{"x"}}
	b := a
	b.LoRA = []string{"x"}
	if !a.Equal(b) {
		t.Fatal("equal adapters must compare equal")
	}
	b.LoRA = []string{"y"}
	if a.Equal(b) {
		t.Fatal("other adapters must not compare equal")
	}
	b = a
	b.URL = "http://h:1"
	if a.Equal(b) {
		t.Fatal("another URL must not compare equal")
	}
}

// TestValidateSharedSocket: two endpoints on one KV-event (or replay)
// socket are refused; each would be credited with the other's blocks
// (found by a walkthrough of kvgate kvindex). Ranks of one data-parallel
// engine publish at their own ports and pass.
func TestValidateSharedSocket(t *testing.T) {
	cases := []struct {
		name string
		eps  []Endpoint
		ok   bool
	}{
		{"shared events", []Endpoint{
			{Name: "a:1", Model: "m", Events: "tcp://h:5557"},
			{Name: "b:1", Model: "m", Events: "tcp://h:5557"},
		}, false},
		{"shared replay", []Endpoint{
			{Name: "a:1", Model: "m", Events: "tcp://h:5557", Replay: "tcp://h:5558"},
			{Name: "b:1", Model: "m", Events: "tcp://h:5567", Replay: "tcp://h:5558"},
		}, false},
		{"events of one, replay of another", []Endpoint{
			{Name: "a:1", Model: "m", Events: "tcp://h:5557"},
			{Name: "b:1", Model: "m", Events: "tcp://h:5567", Replay: "tcp://h:5557"},
		}, false},
		{"own sockets", []Endpoint{
			{Name: "a:1", Model: "m", Events: "tcp://h:5557", Replay: "tcp://h:5558"},
			{Name: "b:1", Model: "m", Events: "tcp://h:5567"},
			{Name: "c:1", Model: "m"},
			{Name: "d:1", Model: "m"},
		}, true},
		{"data-parallel ranks", []Endpoint{{Name: "a:1", Model: "m", Events: "tcp://h:5557", DPSize: 2}}, true},
	}
	for _, c := range cases {
		_, err := Validate(c.eps)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "already endpoints[0]'s") {
			t.Errorf("%s: %v does not name the other endpoint", c.name, err)
		}
	}
}

// TestValidateEach: what one entry breaks is left out, named, and the rest
// is kept (one bad pod froze a discovered fleet: every later list was
// refused whole); Validate accepts what was kept.
func TestValidateEach(t *testing.T) {
	eps := []Endpoint{
		{Name: "a:1", Model: "m", LoRA: []string{"x"}},
		{Name: "b:1", Model: "x"}, // a model named like a's adapter
		{Name: "a:1", Model: "m"}, // a's name again
		{Name: "c:1", Model: "m", Events: "tcp://h:1"},
		{Name: "d:1", Model: "m", Events: "tcp://h:1"}, // c's socket
		{Name: "e:1", Model: "m", DPSize: 2},
		{Name: "f:1"}, // no model
	}
	kept, refused := ValidateEach(eps)
	var names []string
	for _, e := range kept {
		names = append(names, e.Name)
	}
	if strings.Join(names, " ") != "a:1 c:1 e:1" || len(refused) != 4 {
		t.Fatalf("kept %v, refused %v", names, refused)
	}
	for i, want := range []string{"b:1", "a:1", "d:1", "f:1"} {
		if !strings.Contains(refused[i].Error(), "endpoint "+want+" left out") || refused[i].Endpoint.Name != want {
			t.Errorf("refusal %d: %v", i, refused[i])
		}
	}
	if out, err := Validate(kept); err != nil || len(out) != 4 {
		t.Errorf("Validate(kept): %d endpoints, %v", len(out), err)
	}
	if kept, refused := ValidateEach(eps[:1]); len(kept) != 1 || refused != nil {
		t.Errorf("a valid list: %v %v", kept, refused)
	}
}
