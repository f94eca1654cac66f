//go:build !unix

package udp

import "syscall"

func reuseAddr(_, _ string, _ syscall.RawConn) error { return nil }

func bufferSizes(syscall.Conn) (recv, send int, err error) { return 0, 0, nil }
