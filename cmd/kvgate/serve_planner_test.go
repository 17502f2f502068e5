package main

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// routedRoles is the gateway's endpoints and their roles, as
// /admin/endpoints lists them.
func routedRoles(t *testing.T, g *gateway.Gateway) map[string]string {
	t.Helper()
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/endpoints", nil))
	var st struct{ Endpoints []struct{ Name, Role string } }
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	out := map[string]string{}
	for _, e := range st.Endpoints {
		out[e.Name] = e.Role
	}
	return out
}

// TestFleetUnionKeepsPlannerRoles: the planner's engine actuator routes
// through the fleet union: an engine it switches keeps its new role when
// discovery lists the fleet again or a reload lists it in its configured
// role (a SIGHUP put it back, and every prefill leg went to a decode
// engine), one switching is out of routing, and discovered engines it
// does not manage stay in (a switch replaced the gateway's list with the
// planner's configured engines, dropping every discovered one).
func TestFleetUnionKeepsPlannerRoles(t *testing.T) {
	ep := func(name string, role fleet.Role) fleet.Endpoint {
		return fleet.Endpoint{Name: name, URL: "http://127.0.0.1:1", Model: "m", Role: role}
	}
	static := []fleet.Endpoint{ep("p", fleet.RolePrefill), ep("d", fleet.RoleDecode)}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := gateway.New(gateway.Config{Endpoints: static, NoHealthChecks: true}, gateway.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	u := &fleetUnion{static: static, latest: map[int][]fleet.Endpoint{}, g: g, log: log}
	want := func(step string, roles map[string]string) {
		t.Helper()
		if got := routedRoles(t, g); !reflect.DeepEqual(got, roles) {
			t.Fatalf("%s: routed %v, want %v", step, got, roles)
		}
	}
	u.update(0, []fleet.Endpoint{ep("d2", fleet.RoleDecode)})
	want("discovered", map[string]string{"p": "prefill", "d": "decode", "d2": "decode"})

	// The actuator sees the fleet, takes d out to switch it...
	if got := len(u.Fleet()); got != 3 {
		t.Fatalf("the actuator sees %d engines", got)
	}
	if err := u.SetEndpoints([]fleet.Endpoint{ep("p", fleet.RolePrefill), ep("d2", fleet.RoleDecode)}); err != nil {
		t.Fatal(err)
	}
	want("d switching", map[string]string{"p": "prefill", "d2": "decode"})
	// ... and puts it back a prefill engine.
	if err := u.SetEndpoints([]fleet.Endpoint{ep("p", fleet.RolePrefill), ep("d", fleet.RolePrefill), ep("d2", fleet.RoleDecode)}); err != nil {
		t.Fatal(err)
	}
	want("d switched", map[string]string{"p": "prefill", "d": "prefill", "d2": "decode"})

	u.update(0, []fleet.Endpoint{ep("d2", fleet.RoleDecode), ep("d3", fleet.RoleDecode)})
	want("discovered again", map[string]string{"p": "prefill", "d": "prefill", "d2": "decode", "d3": "decode"})

	// A reload lists d in its configured role: the gateway is given the
	// planner's.
	if err := u.reload(static, g.SetEndpoints); err != nil {
		t.Fatal(err)
	}
	want("reloaded", map[string]string{"p": "prefill", "d": "prefill", "d2": "decode", "d3": "decode"})

	// A reload refused (here by the gateway) leaves the union's static
	// endpoints as they were: the next discovery update does not route
	// the refused file's (it did until 2026-12-04).
	refused := append(static, ep("x", fleet.RoleBoth))
	if err := u.reload(refused, func([]fleet.Endpoint) error { return errors.New("refused") }); err == nil {
		t.Fatal("the refusal was not returned")
	}
	u.update(0, []fleet.Endpoint{ep("d2", fleet.RoleDecode)})
	want("after a refused reload", map[string]string{"p": "prefill", "d": "prefill", "d2": "decode"})
}

// TestFleetUnionLeavesOutClashes: a discovered endpoint that clashes with
// a static one (or another's) is left out, logged once while it lasts,
// and the rest of its source's list still applies (before, the gateway
// refused the whole union, then every later one, so deleted engines
// stayed routed and new ones never came).
func TestFleetUnionLeavesOutClashes(t *testing.T) {
	ep := func(name string) fleet.Endpoint {
		return fleet.Endpoint{Name: name, URL: "http://127.0.0.1:1", Model: "m"}
	}
	static := []fleet.Endpoint{ep("e1")}
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	g, err := gateway.New(gateway.Config{Endpoints: static, NoHealthChecks: true}, gateway.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	u := &fleetUnion{static: static, latest: map[int][]fleet.Endpoint{}, g: g, log: log}
	want := func(step string, names ...string) {
		t.Helper()
		roles := map[string]string{}
		for _, n := range names {
			roles[n] = "both"
		}
		if got := routedRoles(t, g); !reflect.DeepEqual(got, roles) {
			t.Fatalf("%s: routed %v, want %v", step, got, names)
		}
	}
	u.update(0, []fleet.Endpoint{ep("e1"), ep("e2")}) // e1 clashes with the static e1
	want("a clash", "e1", "e2")
	u.update(0, []fleet.Endpoint{ep("e1"), ep("e3")})
	want("the next list applies", "e1", "e3")
	if n := strings.Count(logs.String(), "left out of the fleet"); n != 1 {
		t.Errorf("the clash logged %d times:\n%s", n, logs.String())
	}
}
