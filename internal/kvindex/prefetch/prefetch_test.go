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

func TestAddrs(t *testing.T) {
	b := make([]uint64, 1024)
	a := make([]uintptr, 0, 130)
	for i := 0; i < len(b); i += 8 {
		a = append(a, uintptr(unsafe.Pointer(&b[i])))
	}
	a = append(a, 0, ^uintptr(0)) // never faults, whatever the address
	Addrs(a)
	Addrs(nil)
	Addrs(a[:1])
	if b[0] != 0 {
		t.Fatal("prefetch changed memory")
	}
}
