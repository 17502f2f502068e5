package prefetch

import (
	"testing"
	"unsafe"
)

func TestLine(t *testing.T) {
	b := make([]uint64, 1024)
	for i := range b {
		Line(unsafe.Pointer(&b[i]))
	}
	Line(nil) // prefetching any address never faults
}
