//go:build unix

package udp

import (
	"syscall"
)

// reuseAddr lets several members on one host bind the same multicast port.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// bufferSizes reads the receive and send buffer sizes the kernel granted.
// Linux reports twice the usable size (it counts its bookkeeping), so the
// values are halved to compare with what was asked.
func bufferSizes(sc syscall.Conn) (recv, send int, err error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var rerr, serr error
	err = rc.Control(func(fd uintptr) {
		recv, rerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		send, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	})
	if err == nil {
		err = rerr
	}
	if err == nil {
		err = serr
	}
	return recv / 2, send / 2, err
}
