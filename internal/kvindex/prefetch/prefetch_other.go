//go:build !amd64 && !arm64

package prefetch

import "unsafe"

// Line does nothing on this architecture.
func Line(p unsafe.Pointer) {}

// Addrs does nothing on this architecture.
func Addrs(a []uintptr) {}
