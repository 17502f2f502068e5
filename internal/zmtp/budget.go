package zmtp

import (
	"fmt"
	"sync"
	"time"
)

// budget bounds the bytes a socket holds for received messages: queued for
// Recv or being read from a connection.
type budget struct {
	mu      sync.Mutex
	size    int64
	free    int64
	waiters int
	wake    chan struct{} // closed (and replaced) when bytes come back
}

func newBudget(size int64) *budget {
	return &budget{size: size, free: size, wake: make(chan struct{})}
}

// tryAcquire takes n bytes, or the whole budget when n is larger (so any
// one message fits in an empty budget), if they are free now. It returns
// what it took.
func (b *budget) tryAcquire(n int64) (int64, bool) {
	n = min(n, b.size)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free >= n {
		b.free -= n
		return n, true
	}
	return 0, false
}

// acquire is tryAcquire waiting at most wait for the bytes; done aborts the
// wait.
func (b *budget) acquire(n int64, done <-chan struct{}, wait time.Duration) (int64, error) {
	n = min(n, b.size)
	b.mu.Lock()
	if b.free >= n {
		b.free -= n
		b.mu.Unlock()
		return n, nil
	}
	b.waiters++
	defer func() {
		b.waiters--
		b.mu.Unlock()
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	for b.free < n {
		w := b.wake
		b.mu.Unlock()
		select {
		case <-w:
		case <-done:
			b.mu.Lock()
			return 0, ErrClosed
		case <-t.C:
			b.mu.Lock()
			return 0, fmt.Errorf("%w: %d bytes not available within %v", ErrRecvBuffer, n, wait)
		}
		b.mu.Lock()
	}
	b.free -= n
	return n, nil
}

// release gives back n bytes taken by acquire.
func (b *budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.free += n
	if b.waiters > 0 {
		close(b.wake)
		b.wake = make(chan struct{})
	}
	b.mu.Unlock()
}
