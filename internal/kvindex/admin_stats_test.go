package kvindex

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestAdminStatsNoEngines: with no endpoint registered, "endpoints" is an
// empty list, not null.
func TestAdminStatsNoEngines(t *testing.T) {
	srv := httptest.NewServer((&Admin{Index: New(Config{BlockSize: 16})}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/admin/kv/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || string(out["endpoints"]) != "[]" {
		t.Errorf("status %d, endpoints %s; want []", resp.StatusCode, out["endpoints"])
	}
}
