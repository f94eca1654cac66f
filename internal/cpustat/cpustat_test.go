package cpustat

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseStat(t *testing.T) {
	m, err := parseStat("cpu  1194224 10 229438 958611 3464 5 1108 65445 0 0\n")
	require.NoError(t, err)
	require.Equal(t, Machine{Busy: 1194224 + 10 + 229438 + 5 + 1108, Idle: 958611 + 3464, Steal: 65445}, m)
	d := m.Sub(Machine{Busy: m.Busy - 300, Idle: m.Idle - 100, Steal: m.Steal - 100})
	require.InDelta(t, 0.2, d.StealShare(), 1e-9)
	require.Zero(t, Machine{}.StealShare())
	// Busy went backwards: the share is still a share.
	require.InDelta(t, 1.0, Machine{Busy: -40, Steal: 50}.StealShare(), 1e-9)
	// A counter near the bound: the sums stay exact.
	big, err := parseStat("cpu 576460752303423488 576460752303423488 576460752303423488 1 0 576460752303423488 576460752303423488 1")
	require.NoError(t, err)
	require.Equal(t, int64(5<<59), big.Busy)
}

func TestParseStatRefusesWhatIsNotTheCPULine(t *testing.T) {
	for _, line := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3 4 5 6 7", "cpu 1 2 3 x 5 6 7 8", "cpu 1 2 3 -4 5 6 7 8", "cpu 1 2 3 4 5 6 7 576460752303423489"} {
		_, err := parseStat(line)
		require.Error(t, err, "%q", line)
	}
}

func TestReadMachineAndProcess(t *testing.T) {
	m, err := ReadMachine()
	if err != nil {
		t.Skip("no /proc/stat here:", err)
	}
	require.Positive(t, m.Busy+m.Idle)
	before := Process()
	// Busy until the process's CPU time grows (getrusage counts in
	// microseconds); the bound only ends a broken Process.
	for deadline := time.Now().Add(10 * time.Second); Process() <= before; {
		require.True(t, time.Now().Before(deadline), "10 s of a busy loop added no CPU time")
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add("cpu  1194224 0 229438 958611 3464 0 1108 65445 0 0")
	f.Add("cpu 1 2")
	f.Fuzz(func(t *testing.T, line string) {
		m, err := parseStat(line)
		if err == nil {
			require.False(t, m.Busy < 0 || m.Idle < 0 || m.Steal < 0, "negative counters from %q", line)
			share := m.Sub(Machine{}).StealShare()
			require.True(t, share >= 0 && share <= 1, "share %v from %q", share, line)
		}
	})
}
