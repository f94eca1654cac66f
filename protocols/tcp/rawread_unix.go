//go:build unix

package tcp

import (
	"errors"
	"syscall"
)

// canReadRaw: a frameReader reads plain TCP connections through their
// raw file descriptor, so that it can let go of its chunk when a read
// would block.
const canReadRaw = true

func readRaw(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), p)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return max(n, 0), err
	}
}

func wouldBlock(err error) bool { return errors.Is(err, syscall.EAGAIN) }
