// Package kvspec parses the comma-separated key=value specs that kvgate's
// flags take, such as "name=127.0.0.1:8001,model=m,events=tcp://…".
package kvspec

import (
	"fmt"
	"strings"
)

// Each calls fn for every key=value pair of s in order. Blank items are
// skipped; an item without "=" is an error, as is any error fn returns.
func Each(s string, fn func(key, value string) error) error {
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", item)
		}
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}
