package engine

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// The JSON of GET /admin/role as docs/engine.md documents it: target_role
// only while a switch is in progress.
func TestRoleStatusJSON(t *testing.T) {
	prefill := fleet.RolePrefill
	for _, tt := range []struct {
		st   RoleStatus
		want string
	}{
		{RoleStatus{Role: fleet.RoleBoth, State: stateServing}, `{"role":"both","state":"serving","in_flight":0}`},
		{RoleStatus{Role: fleet.RoleDecode, State: stateServing, InFlight: 3}, `{"role":"decode","state":"serving","in_flight":3}`},
		{RoleStatus{Role: fleet.RoleBoth, State: stateDraining, TargetRole: &prefill, InFlight: 1}, `{"role":"both","state":"draining","target_role":"prefill","in_flight":1}`},
	} {
		b, err := json.Marshal(tt.st)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tt.want {
			t.Errorf("got %s, want %s", b, tt.want)
		}
	}
}

func TestSetRoleRejects(t *testing.T) {
	e := startEngine(t)
	for _, body := range []map[string]any{{}, {"role": ""}, {"role": "sideways"}, {"role": "Both"}} {
		if resp, out := postJSON(t, e.URL()+"/admin/role", body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%v: %d %s", body, resp.StatusCode, out)
		}
	}
	if err := e.SwitchRole(fleet.RoleDecode + 1); err == nil {
		t.Error("SwitchRole accepted an unknown role value")
	}
	if st := e.RoleStatus(); st.Role != fleet.RoleBoth || st.State != stateServing || st.TargetRole != nil {
		t.Errorf("after rejected switches: %+v", st)
	}
}
