package engineauth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestTransport(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	for _, tc := range []struct{ key, client, want string }{
		{"", "", ""},
		{"", "Bearer client", "Bearer client"},
		{"k1", "", "Bearer k1"},
		{"k1", "Bearer client", "Bearer k1"},
	} {
		got = nil
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if tc.client != "" {
			req.Header.Set("Authorization", tc.client)
		}
		resp, err := (&http.Client{Transport: Transport(nil, tc.key)}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("key %q, client %q: engine got %q, want %q", tc.key, tc.client, got, tc.want)
		}
		if tc.client != "" && req.Header.Get("Authorization") != tc.client {
			t.Errorf("the caller's request was changed")
		}
	}
}

func TestCheck(t *testing.T) {
	for _, bad := range []string{"", "  ", "a\nb", " sk", "sk ", strings.Repeat("k", 4097)} {
		if Check(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := Check("sk-abc"); err != nil {
		t.Error(err)
	}
}

// TestRedirectElsewhereHasNoKey: the key follows a redirect on the same
// host, not one to another (it was sent wherever an engine redirected).
func TestRedirectElsewhereHasNoKey(t *testing.T) {
	got := map[string]string{}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got["other"] = r.Header.Get("Authorization")
	}))
	defer other.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/x", http.StatusTemporaryRedirect)
		case "/here":
			http.Redirect(w, r, "/final", http.StatusTemporaryRedirect)
		default:
			got["final"] = r.Header.Get("Authorization")
		}
	}))
	defer engine.Close()
	c := &http.Client{Transport: Transport(nil, "k1")}
	for _, p := range []string{"/away", "/here"} {
		resp, err := c.Get(engine.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got["other"] != "" || got["final"] != "Bearer k1" {
		t.Errorf("another host got %q, the same host %q", got["other"], got["final"])
	}
}
