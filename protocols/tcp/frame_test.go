package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/transport"
)

func TestFrameRoundTripAndBounds(t *testing.T) {
	var b []byte
	b = appendFrameHeader(b, 3)
	b = append(b, 1, 2, 3)
	got, err := readFrame(bytes.NewReader(b), 3)
	require.NoError(t, err)
	require.Equal(t, []byte{1, 2, 3}, got)

	_, err = readFrame(bytes.NewReader(b), 2)
	require.ErrorIs(t, err, errBadFrame, "a frame above the bound is refused")
	_, err = readFrame(bytes.NewReader(appendFrameHeader(nil, 0)), 10)
	require.ErrorIs(t, err, errBadFrame, "an empty frame is refused")
	_, err = readFrame(bytes.NewReader(b[:5]), 10)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated frame is an error")
	_, err = readFrame(bytes.NewReader(b[:2]), 10)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated length is an error")
}

// TestOversizedFrameAllocatesNothing: a peer that announces a 4GB frame
// makes the reader allocate nothing before it is refused.
func TestOversizedFrameAllocatesNothing(t *testing.T) {
	hdr := binary.BigEndian.AppendUint32(nil, 0xFFFFFFF0)
	r := bytes.NewReader(hdr)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		r.Reset(hdr)
		if _, err := readFrame(r, 64000); !errors.Is(err, errBadFrame) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(100*1024), "the error's few bytes per frame, never the frame")
}

func TestHelloRoundTrip(t *testing.T) {
	for _, s := range []string{"127.0.0.1:7800", "[::1]:7801", "10.1.2.3:65535"} {
		ap := netip.MustParseAddrPort(s)
		got, err := readHello(bytes.NewReader(appendHello(nil, ap)))
		require.NoError(t, err)
		require.Equal(t, ap, got)
	}
	for name, b := range map[string][]byte{
		"magic":   []byte("XXXX\x01\x04\x7f\x00\x00\x01\x1e\x78"),
		"version": []byte("STCP\x02\x04\x7f\x00\x00\x01\x1e\x78"),
		"family":  []byte("STCP\x01\x05\x7f\x00\x00\x01\x1e\x78"),
		"port 0":  []byte("STCP\x01\x04\x7f\x00\x00\x01\x00\x00"),
		"any":     []byte("STCP\x01\x04\x00\x00\x00\x00\x1e\x78"),
	} {
		_, err := readHello(bytes.NewReader(b))
		require.ErrorIs(t, err, errBadHello, name)
	}
}

// FuzzFrames feeds a connection's byte stream (a preamble, then frames) to
// the decoders: they never panic, never return a frame above the bound,
// and what they accept encodes back to the same bytes.
func FuzzFrames(f *testing.F) {
	good := appendHello(nil, netip.MustParseAddrPort("127.0.0.1:7800"))
	good = appendFrameHeader(good, 5)
	good = append(good, "hello"...)
	f.Add(good)
	f.Add(good[:len(good)-2])
	f.Add(append(appendHello(nil, netip.MustParseAddrPort("[::1]:1")), 0xFF, 0xFF, 0xFF, 0xFF))
	f.Add([]byte{})
	const max = 1024
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		ap, err := readHello(r)
		if err != nil {
			return
		}
		if !bytes.Equal(appendHello(nil, ap), data[:len(data)-r.Len()]) {
			t.Fatalf("preamble %s does not encode back", ap)
		}
		for {
			fr, err := readFrame(r, max)
			if err != nil {
				return
			}
			if len(fr) == 0 || len(fr) > max {
				t.Fatalf("frame of %d bytes accepted", len(fr))
			}
		}
	})
}

// chopReader returns at most the next of sizes bytes per Read (cycling),
// as a socket returns what has arrived.
type chopReader struct {
	data  []byte
	sizes []int
	i     int
}

func (c *chopReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data))
	if len(c.sizes) > 0 {
		n = min(n, max(1, c.sizes[c.i%len(c.sizes)]))
		c.i++
	}
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// frameStream returns frames of the given sizes, each filled with bytes
// that depend on its index, and the stream that carries them.
func frameStream(sizes []int) (frames [][]byte, stream []byte) {
	for i, n := range sizes {
		f := make([]byte, n)
		for j := range f {
			f[j] = byte(i*31 + j*7)
		}
		frames = append(frames, f)
		stream = appendFrameHeader(stream, n)
		stream = append(stream, f...)
	}
	return frames, stream
}

// TestFrameReaderKeepsFramesIntact reads frames of many sizes (some larger
// than a receive chunk, many straddling chunk ends) through reads of many
// sizes, keeps every frame, and checks at the end that none was
// overwritten by a later read: the reader never reads into bytes it
// handed out.
func TestFrameReaderKeepsFramesIntact(t *testing.T) {
	const max = 3 << 20
	var sizes []int
	for i := range 3000 {
		switch {
		case i%500 == 7:
			sizes = append(sizes, transport.RecvChunkSize+i) // a buffer of its own
		case i%10 == 0:
			sizes = append(sizes, 20000+i*13%45000)
		default:
			sizes = append(sizes, 1+i*37%3000)
		}
	}
	sizes = append(sizes, max)
	want, stream := frameStream(sizes)
	for name, chop := range map[string][]int{
		"whole":  nil,
		"small":  {1, 3, 4, 5, 100, 4095},
		"mixed":  {70000, 3, 1 << 20, 17, 9000},
		"header": {4, 1, 2, 1},
	} {
		t.Run(name, func(t *testing.T) {
			fr := newFrameReader(&chopReader{data: stream, sizes: chop}, max)
			var got [][]byte
			for {
				f, err := fr.next()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
				require.Equal(t, len(f), cap(f), "a frame's capacity ends with it")
				got = append(got, f)
			}
			require.Len(t, got, len(want))
			for i := range want {
				require.True(t, bytes.Equal(want[i], got[i]), "frame %d (%d bytes) changed", i, len(want[i]))
			}
		})
	}
}

func TestFrameReaderBoundsAndTruncation(t *testing.T) {
	var b []byte
	b = appendFrameHeader(b, 3)
	b = append(b, 1, 2, 3)
	_, err := newFrameReader(bytes.NewReader(b), 2).next()
	require.ErrorIs(t, err, errBadFrame, "a frame above the bound is refused")
	_, err = newFrameReader(bytes.NewReader(appendFrameHeader(nil, 0)), 10).next()
	require.ErrorIs(t, err, errBadFrame, "an empty frame is refused")
	_, err = newFrameReader(bytes.NewReader(b[:5]), 10).next()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated frame is an error")
	_, err = newFrameReader(bytes.NewReader(b[:2]), 10).next()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated length is an error")
	_, err = newFrameReader(bytes.NewReader(nil), 10).next()
	require.ErrorIs(t, err, io.EOF, "a stream that ends between frames")
	big := appendFrameHeader(nil, transport.RecvChunkSize+10)
	big = append(big, make([]byte, 100)...)
	_, err = newFrameReader(bytes.NewReader(big), 2<<20).next()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated frame larger than a chunk")
}

// FuzzFrameReader checks the in-place reader against readFrame, the
// plain one, on any stream cut into reads of any sizes: the same frames
// or the same class of error, and no frame above the bound.
func FuzzFrameReader(f *testing.F) {
	_, good := frameStream([]int{5, 1, 300, 2})
	f.Add(good, []byte{1, 2, 3})
	f.Add(good[:len(good)-2], []byte{})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF}, []byte{4})
	f.Add(append(appendFrameHeader(nil, 0), good...), []byte{})
	const max = 1024
	f.Fuzz(func(t *testing.T, data, chop []byte) {
		sizes := make([]int, len(chop))
		for i, c := range chop {
			sizes[i] = int(c)
		}
		fr := newFrameReader(&chopReader{data: data, sizes: sizes}, max)
		ref := bytes.NewReader(data)
		for {
			want, werr := readFrame(ref, max)
			got, err := fr.next()
			if werr != nil {
				require.Error(t, err)
				require.Equal(t, errors.Is(werr, errBadFrame), errors.Is(err, errBadFrame), "%v vs %v", err, werr)
				require.Equal(t, errors.Is(werr, io.ErrUnexpectedEOF), errors.Is(err, io.ErrUnexpectedEOF), "%v vs %v", err, werr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.LessOrEqual(t, len(got), max)
		}
	})
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// keptFrame is the frame TestIdleFrameReaderLetsGoOfItsChunk keeps, where
// the garbage collector is sure to see it.
var keptFrame []byte

// TestIdleFrameReaderLetsGoOfItsChunk: a reader waiting on an idle
// connection holds its receive chunk only weakly: a garbage collection
// frees it when nothing else refers into it, and the next frame goes to a
// new chunk; when a frame handed out still refers into it, the reader
// takes the same chunk back and goes on where it was. (The wait ends with
// a read deadline, so that the test reads the reader's state on the
// reader's own goroutine.)
func TestIdleFrameReaderLetsGoOfItsChunk(t *testing.T) {
	if !canReadRaw {
		t.Skip("reads through net.Conn here")
	}
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			w, r := tcpPair(t)
			fr := newFrameReader(r, 1000)
			require.NotNil(t, fr.rc)
			send := func(b byte) {
				_, err := w.Write(append(appendFrameHeader(nil, 10), bytes.Repeat([]byte{b}, 10)...))
				require.NoError(t, err)
			}
			send(1)
			func() {
				first, err := fr.next() // dead once this returns, unless kept
				require.NoError(t, err)
				if keep {
					keptFrame = first
				}
			}()
			for d := 50 * time.Millisecond; fr.released.Load() == 0; d *= 2 {
				require.NoError(t, r.SetReadDeadline(time.Now().Add(d)))
				_, err := fr.next()
				require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			}
			require.Nil(t, fr.chunk, "the waiting reader let go")
			runtime.GC()
			runtime.GC()
			require.Equal(t, keep, fr.idle.Value() != nil, "only a chunk something refers into survives the collection")
			require.NoError(t, r.SetReadDeadline(time.Time{}))
			send(2)
			f, err := fr.next()
			require.NoError(t, err)
			require.Equal(t, bytes.Repeat([]byte{2}, 10), f)
			// Frames are 14 bytes with their length: the second one follows
			// the first in the same chunk, or starts a new one (perhaps the
			// same memory, recycled).
			want := 14
			if keep {
				want = 28
			}
			require.Equal(t, want, fr.start, "the same chunk only when it was kept")
			if keep {
				require.Equal(t, bytes.Repeat([]byte{1}, 10), keptFrame)
				keptFrame = nil
			}
		})
	}
}

// TestStalledFrameReaderParksThePartialFrame: a reader waiting for the
// rest of a frame moves the part it has to a buffer of its own and lets
// go of its 1 MB chunk, so a peer that sends part of a frame on many
// connections pins no chunk with each; the frame comes out whole once the
// rest arrives.
func TestStalledFrameReaderParksThePartialFrame(t *testing.T) {
	if !canReadRaw {
		t.Skip("reads through net.Conn here")
	}
	w, r := tcpPair(t)
	fr := newFrameReader(r, 1000)
	body := bytes.Repeat([]byte{7}, 600)
	frame := append(appendFrameHeader(nil, len(body)), body...)
	_, err := w.Write(frame[:300])
	require.NoError(t, err)
	for d := 50 * time.Millisecond; fr.released.Load() == 0; d *= 2 {
		require.Less(t, d, 5*time.Second, "the stalled reader never let go of its chunk")
		require.NoError(t, r.SetReadDeadline(time.Now().Add(d)))
		_, err := fr.next()
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	}
	require.Nil(t, fr.chunk, "the stalled reader let go of its chunk")
	require.Equal(t, frame[:300], fr.parked, "it keeps the start of the frame")
	require.NoError(t, r.SetReadDeadline(time.Time{}))
	_, err = w.Write(frame[300:])
	require.NoError(t, err)
	got, err := fr.next()
	require.NoError(t, err)
	require.Equal(t, body, got)
	require.Empty(t, fr.parked)
}
