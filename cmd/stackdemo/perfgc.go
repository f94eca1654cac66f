package main

import (
	"fmt"
	"math"
	"runtime/metrics"
	"strconv"

	"github.com/strata-go/strata/stack"
)

// gcCost is what the Go collector did during a measured round and how it
// was paced (GOGC, GOMEMLIMIT), so that a figure says how much of its
// CPU the collector took and under which setting.
type gcCost struct {
	Cycles     uint64  `json:"cycles"`
	CPUSeconds float64 `json:"cpu_seconds"` // the runtime's estimate of marking, assists and pauses (sweeping is counted as the allocating code's)
	// CPUShare is CPUSeconds over the CPU time the runtime counts as busy
	// (Go code and the runtime's own work) in the round.
	CPUShare float64 `json:"cpu_share"`
	GOGC     string  `json:"gogc"`                 // "off" or a percentage
	Limit    int64   `json:"gomemlimit,omitempty"` // bytes; absent: no limit
}

// String reads like "340 cycles, 0.41s of CPU (11%); GOGC=200 GOMEMLIMIT=1GiB".
func (g gcCost) String() string {
	s := fmt.Sprintf("%d cycles, %.2fs of CPU (%.0f%%); GOGC=%s", g.Cycles, g.CPUSeconds, 100*g.CPUShare, g.GOGC)
	if g.Limit > 0 {
		s += " GOMEMLIMIT=" + stack.Size(g.Limit).String()
	}
	return s
}

// gcSample is one reading of the collector's counters and settings.
type gcSample struct {
	cycles             uint64
	gcCPU, total, idle float64 // seconds
	gogc               uint64
	limit              uint64
}

// gcMetrics are the runtime/metrics names readGC reads, in gcSample's order.
var gcMetrics = []string{
	"/gc/cycles/total:gc-cycles",
	"/cpu/classes/gc/total:cpu-seconds",
	"/cpu/classes/total:cpu-seconds",
	"/cpu/classes/idle:cpu-seconds",
	"/gc/gogc:percent",
	"/gc/gomemlimit:bytes",
}

// readGC reads the collector's counters and settings now.
func readGC() gcSample {
	ss := make([]metrics.Sample, len(gcMetrics))
	for i, n := range gcMetrics {
		ss[i].Name = n
	}
	metrics.Read(ss)
	u := func(i int) uint64 {
		if ss[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return ss[i].Value.Uint64()
	}
	f := func(i int) float64 {
		if ss[i].Value.Kind() != metrics.KindFloat64 {
			return 0
		}
		return ss[i].Value.Float64()
	}
	return gcSample{cycles: u(0), gcCPU: f(1), total: f(2), idle: f(3), gogc: u(4), limit: u(5)}
}

// since is the collector's cost between s0 and s, with s's settings. The
// share is of the runtime's own estimates (GOMAXPROCS over the wall clock,
// less idle time), which are not comparable with the system's CPU time.
func (s gcSample) since(s0 gcSample) gcCost {
	g := gcCost{Cycles: s.cycles - s0.cycles, CPUSeconds: s.gcCPU - s0.gcCPU, GOGC: "off"}
	if t := (s.total - s0.total) - (s.idle - s0.idle); t > 0 {
		g.CPUShare = g.CPUSeconds / t
	}
	// GOGC=off reads as a percentage of -1 (math.MaxUint64 in a uint64).
	if s.gogc != math.MaxUint64 {
		g.GOGC = strconv.FormatUint(s.gogc, 10)
	}
	if s.limit < math.MaxInt64 {
		g.Limit = int64(s.limit)
	}
	return g
}
