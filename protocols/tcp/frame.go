package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
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
// peer is never trusted for more than max bytes.
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
