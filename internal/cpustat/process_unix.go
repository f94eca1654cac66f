//go:build unix

package cpustat

import (
	"syscall"
	"time"
)

// Process is this process's user and system CPU time so far (getrusage).
// Unlike elapsed time it does not count what the host takes away.
func Process() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
