package prefetch

import "unsafe"

// Line prefetches the cache line holding p for a load. It never faults and
// has no effect on program semantics.
//
//go:noescape
func Line(p unsafe.Pointer)

// Addrs prefetches the cache line at each address of a, in order, with one
// call: a loop that prefetches a batch of slots pays the cost of calling
// out of Go (its registers spilled around the call) once per batch.
//
//go:noescape
func Addrs(a []uintptr)
