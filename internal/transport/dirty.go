package transport

import "unsafe"

// mallocgc is the runtime's allocator. Its signature is kept stable for
// callers outside the runtime (go.dev/issue/67401); with a nil type and
// needzero false it returns memory the collector does not scan and does
// not clear.
//
//go:linkname mallocgc runtime.mallocgc
func mallocgc(size uintptr, typ unsafe.Pointer, needzero bool) unsafe.Pointer

// newDirtyChunk returns a receive chunk that is not cleared: what it held
// before is still in it. A chunk is only ever read through the datagrams
// written into it (Take hands out exactly the bytes a read returned, with
// capacity ending there), so the old bytes are never seen, and clearing
// 1 MB a chunk cost 8% of a one-sender run's CPU.
func newDirtyChunk() *recvChunk {
	return (*recvChunk)(mallocgc(RecvChunkSize, nil, false))
}
