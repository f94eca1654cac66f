// Package cpustat reads the CPU time a benchmark spends and the CPU time
// the host takes away from this machine, so that speed figures from a
// shared virtual machine come with what they cost and how quiet it was.
package cpustat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// maxTicks bounds each counter read, so that sums of all eight cannot
// overflow.
const maxTicks = 1 << 59

// Machine is the machine's CPU time so far, summed over its CPUs, in the
// ticks (USER_HZ) of the first line of /proc/stat.
type Machine struct {
	Busy  int64 // user, nice, system, irq and softirq
	Idle  int64 // idle and iowait
	Steal int64 // the host ran something else while a CPU of this machine wanted to run
}

// ReadMachine returns the machine's counters (Linux only: elsewhere an
// error).
func ReadMachine() (Machine, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return Machine{}, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return Machine{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return parseStat(line)
}

// parseStat reads the aggregate "cpu" line of /proc/stat: user nice system
// idle iowait irq softirq steal [guest guest_nice].
func parseStat(line string) (Machine, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return Machine{}, errors.New("/proc/stat: no aggregate cpu line with a steal column")
	}
	var v [8]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || n < 0 || n > maxTicks {
			return Machine{}, fmt.Errorf("/proc/stat: column %d: %q is not a count", i+1, f[i+1])
		}
		v[i] = n
	}
	return Machine{Busy: v[0] + v[1] + v[2] + v[5] + v[6], Idle: v[3] + v[4], Steal: v[7]}, nil
}

// Sub returns the counters' growth since before.
func (m Machine) Sub(before Machine) Machine {
	return Machine{Busy: m.Busy - before.Busy, Idle: m.Idle - before.Idle, Steal: m.Steal - before.Steal}
}

// StealShare is the share of the machine's CPU time in m that the host
// took (0 when m holds none): above a few percent, other guests compete
// for the cores and speed figures are not a quiet machine's.
func (m Machine) StealShare() float64 {
	// A counter that went backwards (a host that resets /proc/stat, two
	// samples taken the wrong way round) counts as none, so the share
	// stays within 0..1.
	total := max(m.Busy, 0) + max(m.Idle, 0) + m.Steal
	if total <= 0 || m.Steal <= 0 {
		return 0
	}
	return float64(m.Steal) / float64(total)
}
