package prefetch

import "unsafe"

// Line prefetches the cache line holding p into all cache levels. It never
// faults and has no effect on program semantics.
//
//go:noescape
func Line(p unsafe.Pointer)
