package prefetch

import "unsafe"

// Line prefetches the cache line holding p for a load. It never faults and
// has no effect on program semantics.
//
//go:noescape
func Line(p unsafe.Pointer)
