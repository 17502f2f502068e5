// Package prefetch asks the CPU to bring a cache line in ahead of its use.
//
// A hash table insert or lookup is a random memory access; when the keys
// of a batch are known in advance, prefetching all their slots first lets
// the cache misses overlap (and overlap with other work) instead of being
// paid one after another. An ordinary load would do the same but keeps the
// load in the reorder buffer until the data arrives, stalling retirement;
// a prefetch instruction retires at once. On architectures without an
// implementation Line does nothing.
package prefetch
