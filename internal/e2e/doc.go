// Package e2e holds end-to-end tests that wire kvgate's pieces together over
// real sockets on 127.0.0.1: engine emulators publishing vLLM KV events over
// ZMQ, the event subscriber and the global prefix index. It has no
// non-test code.
package e2e
