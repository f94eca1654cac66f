package tcp

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkFramePath is the TCP transport's own share of a bundle's way
// from one member to another over loopback, without the stack: a peer's
// writer sending 60,000-byte frames (what tcp.toml's 64 KB bundles hold)
// with writev, up to two per call as it does under load, and a connection's
// frameReader taking them out of its receive chunks. What it reports is
// nearly all system calls (the kernel copying each frame twice, the copy
// into a receive chunk the dearer: the chunk is cold in the cache); allocs/op
// is the transport's per-frame garbage (B/op is the 1 MB receive chunks the
// garbage collector has not recycled yet). sockbuf is tcp.toml's
// send_buf_size and recv_buf_size (0: the kernel's auto-tuning).
func BenchmarkFramePath(b *testing.B) {
	const size = 60000
	for _, sockbuf := range []int{150000, 0} {
		b.Run(fmt.Sprint("sockbuf=", sockbuf), func(b *testing.B) {
			w, r := tcpPair(b)
			if sockbuf > 0 {
				for _, c := range []interface{ SetReadBuffer(int) error }{w, r} {
					if err := c.SetReadBuffer(sockbuf); err != nil {
						b.Fatal(err)
					}
				}
				if err := w.SetWriteBuffer(sockbuf); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.SetNoDelay(true); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, size)
			f := &frame{buf: &buf}
			c := &conn{nc: w, raw: w}
			n := b.N
			errc := make(chan error, 1)
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			go func() {
				var bufs batchBufs
				batch := []*frame{f, f}
				for i := 0; i < n; i += 2 {
					if err := c.writeFrames(batch[:min(2, n-i)], &bufs); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			fr := newFrameReader(r, size)
			for range n {
				got, err := fr.next()
				if err != nil {
					b.Fatal(err)
				}
				if len(got) != size {
					b.Fatalf("frame of %d bytes, want %d", len(got), size)
				}
			}
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "frames/s")
		})
	}
}
