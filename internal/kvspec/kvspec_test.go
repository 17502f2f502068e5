package kvspec

import (
	"errors"
	"strings"
	"testing"
)

func TestEach(t *testing.T) {
	var got []string
	err := Each(" a=1, ,b=x=y,c=", func(k, v string) error {
		got = append(got, k+":"+v)
		return nil
	})
	if err != nil || strings.Join(got, "|") != "a:1|b:x=y|c:" {
		t.Fatalf("got %v, %v", got, err)
	}
	if err := Each("a=1,oops", func(k, v string) error { return nil }); err == nil || !strings.Contains(err.Error(), `"oops" is not key=value`) {
		t.Fatalf("want a key=value error, got %v", err)
	}
	stop := errors.New("stop")
	if err := Each("a=1,b=2", func(k, v string) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fn's error must come back, got %v", err)
	}
}
