//go:build !unix

package cpustat

import "time"

// Process is this process's CPU time so far; 0 where getrusage is missing.
func Process() time.Duration { return 0 }
