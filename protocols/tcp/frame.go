package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"weak"

	"github.com/strata-go/strata/internal/transport"
)

// A connection starts with a preamble from the side that dialled: magic,
// version, and the address its listener is at (so both sides key the
// connection by listening addresses, and simultaneous dials can be told
// apart). Then each side sends frames: a 4-byte big-endian length and that
// many bytes of one bundle.

var helloMagic = [4]byte{'S', 'T', 'C', 'P'}

const (
	helloVersion = 1
	frameHeader  = 4
)

var (
	errBadHello = errors.New("tcp: bad connection preamble")
	errBadFrame = errors.New("tcp: bad frame length")
)

// appendHello appends the preamble announcing listen.
func appendHello(b []byte, listen netip.AddrPort) []byte {
	b = append(b, helloMagic[:]...)
	b = append(b, helloVersion)
	a := listen.Addr()
	if a.Is4() {
		b = append(b, 4)
		a4 := a.As4()
		b = append(b, a4[:]...)
	} else {
		b = append(b, 6)
		a16 := a.As16()
		b = append(b, a16[:]...)
	}
	return binary.BigEndian.AppendUint16(b, listen.Port())
}

// readHello reads a preamble. It reads at most 24 bytes whatever r holds.
func readHello(r io.Reader) (netip.AddrPort, error) {
	var h [6]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return netip.AddrPort{}, err
	}
	if [4]byte(h[:4]) != helloMagic {
		return netip.AddrPort{}, fmt.Errorf("%w: magic %x", errBadHello, h[:4])
	}
	if h[4] != helloVersion {
		return netip.AddrPort{}, fmt.Errorf("%w: version %d", errBadHello, h[4])
	}
	var n int
	switch h[5] {
	case 4:
		n = 4
	case 6:
		n = 16
	default:
		return netip.AddrPort{}, fmt.Errorf("%w: address family %d", errBadHello, h[5])
	}
	var buf [18]byte
	if _, err := io.ReadFull(r, buf[:n+2]); err != nil {
		return netip.AddrPort{}, err
	}
	a, _ := netip.AddrFromSlice(buf[:n])
	port := binary.BigEndian.Uint16(buf[n : n+2])
	if n == 16 && a.Is4In6() {
		// One encoding per address: an IPv4 address goes as family 4.
		return netip.AddrPort{}, fmt.Errorf("%w: IPv4-mapped address %s as family 6", errBadHello, a)
	}
	if port == 0 || !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
		return netip.AddrPort{}, fmt.Errorf("%w: listen address %s:%d", errBadHello, a, port)
	}
	return netip.AddrPortFrom(a.Unmap(), port), nil
}

// appendFrameHeader appends the length prefix of a frame of n bytes.
func appendFrameHeader(b []byte, n int) []byte { return binary.BigEndian.AppendUint32(b, uint32(n)) }

// readFrame reads one frame of at most max bytes into a new buffer. A
// length of 0 or above max is an error before anything is allocated: a
// peer is never trusted for more than max bytes. (The connections read
// through a frameReader; this is the reference it is tested against.)
func readFrame(r io.Reader, max int) ([]byte, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n == 0 || n > uint32(max) {
		return nil, fmt.Errorf("%w: %d (max %d)", errBadFrame, n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// minRead is the least free space a frameReader reads into: with less
// left in its chunk, it moves what it holds of the next frame to a new
// chunk first, so reads stay large.
const minRead = 16 << 10

// frameReader reads a connection's frames in place: each read fills as
// much of a receive chunk (transport.NewRecvChunk) as the connection
// has ready, and the frames are handed out as slices of the chunk, so
// the messages decoded from them alias it instead of a copy per frame.
// Nothing is ever read into bytes handed out: when a frame does not fit
// in what is left of the chunk, the part of it already read is moved to
// a new chunk (the only copy, at most one partial frame per chunk), and
// the old chunk is recycled once the garbage collector finds nothing
// refers into it. A frame larger than a chunk gets a buffer of its own.
//
// On a plain TCP connection, a reader that has handed out everything it
// read and finds nothing more to read lets go of its chunk while it waits
// (it keeps a weak pointer): a connection that stays idle over a garbage
// collection holds no receive memory, and one that is busy gets its chunk
// back. A connection that stops in the middle of a frame moves the part
// it has (at most a frame, max_bundle_size) to a buffer of its own and
// lets go of the chunk too, so a peer that sends part of a frame on many
// connections holds no chunk with each. (Over TLS the reader reads
// through the TLS connection and keeps its chunk.)
//
// A frameReader belongs to one reading goroutine.
type frameReader struct {
	r      io.Reader
	rc     syscall.RawConn // plain TCP: reads go through it (see rawRead)
	readFn func(fd uintptr) bool
	n      int   // rawRead's result
	rerr   error // rawRead's error
	max    int
	chunk  []byte
	start  int // first byte not handed out
	end    int // end of the bytes read

	idle     weak.Pointer[[transport.RecvChunkSize]byte] // the chunk let go of while waiting
	parked   []byte                                      // the start of a frame, moved out of the chunk let go of
	released atomic.Int64                                // times it let go (for tests)
}

func newFrameReader(r io.Reader, max int) *frameReader {
	fr := &frameReader{r: r, max: max}
	if sc, ok := r.(syscall.Conn); ok && canReadRaw {
		if _, isTCP := r.(*net.TCPConn); isTCP {
			fr.rc, _ = sc.SyscallConn()
			fr.readFn = fr.rawRead
		}
	}
	return fr
}

// read reads into the free space of the chunk.
func (fr *frameReader) read() (int, error) {
	if fr.rc == nil {
		return fr.r.Read(fr.chunk[fr.end:])
	}
	fr.n, fr.rerr = 0, nil
	if err := fr.rc.Read(fr.readFn); err != nil {
		return 0, err
	}
	switch {
	case fr.rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", fr.rerr)}
	case fr.n == 0:
		return 0, io.EOF
	}
	return fr.n, nil
}

// rawRead is read's function for the raw connection (bound once, in
// newFrameReader, so that a read allocates nothing): it reads into the
// chunk, and when the read would block with every byte read so far
// handed out, it lets go of the chunk while the connection waits.
func (fr *frameReader) rawRead(fd uintptr) bool {
	if fr.chunk == nil {
		fr.regain()
	}
	fr.n, fr.rerr = readRaw(fd, fr.chunk[fr.end:])
	if wouldBlock(fr.rerr) {
		if fr.start == fr.end {
			fr.letGo()
		} else {
			fr.park()
		}
		return false
	}
	return true
}

// park copies the start of a frame that the reader waits for the rest of
// out of its chunk, and lets go of the chunk (keeping a weak pointer) while
// the connection waits: if frames handed out keep the chunk alive, the
// reader takes it back as it was, and only if it was collected does the
// copy go to a new chunk.
func (fr *frameReader) park() {
	fr.parked = append(fr.parked[:0], fr.chunk[fr.start:fr.end]...)
	fr.letGo()
}

// letGo drops the reader's hold on its chunk, all of whose bytes read so
// far are handed out, keeping a weak pointer to it.
func (fr *frameReader) letGo() {
	fr.idle = weak.Make((*[transport.RecvChunkSize]byte)(fr.chunk))
	fr.chunk = nil
	fr.released.Add(1)
}

// regain takes the chunk let go of back, or, if the garbage collector
// found nothing else referred into it (it is being recycled), a new one.
func (fr *frameReader) regain() {
	if c := fr.idle.Value(); c != nil {
		fr.chunk = c[:] // as it was: nothing is read into a live chunk but by this reader
	} else {
		fr.chunk = transport.NewRecvChunk()
		fr.start, fr.end = 0, copy(fr.chunk, fr.parked)
	}
	fr.parked = fr.parked[:0]
	fr.idle = weak.Pointer[[transport.RecvChunkSize]byte]{}
}

// next returns the next frame, which stays the caller's for good. A
// length of 0 or above max is errBadFrame before anything is allocated
// for it; a stream that ends inside a frame is io.ErrUnexpectedEOF, one
// that ends between frames io.EOF.
func (fr *frameReader) next() ([]byte, error) {
	for {
		if fr.chunk == nil && fr.end > 0 {
			fr.regain() // a read that let go of the chunk failed
		}
		avail := fr.end - fr.start
		need := minRead
		if avail >= frameHeader {
			n := binary.BigEndian.Uint32(fr.chunk[fr.start:])
			if n == 0 || n > uint32(fr.max) {
				return nil, fmt.Errorf("%w: %d (max %d)", errBadFrame, n, fr.max)
			}
			size := frameHeader + int(n)
			if avail >= size {
				lo := fr.start + frameHeader
				fr.start += size
				return fr.chunk[lo:fr.start:fr.start], nil
			}
			if size > transport.RecvChunkSize {
				return fr.readLarge(int(n))
			}
			need = max(need, size)
		}
		if len(fr.chunk)-fr.start < need {
			c := transport.NewRecvChunk()
			fr.end = copy(c, fr.chunk[fr.start:fr.end])
			fr.chunk, fr.start = c, 0
		}
		k, err := fr.read()
		fr.end += k
		if err != nil && k == 0 {
			if err == io.EOF && fr.end > fr.start {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// readLarge reads a frame of n bytes, larger than a chunk, whose start
// the chunk holds, into a buffer of its own.
func (fr *frameReader) readLarge(n int) ([]byte, error) {
	buf := make([]byte, n)
	k := copy(buf, fr.chunk[fr.start+frameHeader:fr.end])
	fr.start = fr.end
	if _, err := io.ReadFull(fr.r, buf[k:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}
