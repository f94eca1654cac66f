package all_test

// The scale suite runs udp.toml (SIM in place of UDP) at sizes given by
// STRATA_SCALE ("128", or "64,128,256"), in virtual time; without it the
// test is skipped. STRATA_SCALE_MAX_BUNDLE_SIZE ("2KB") sets SIM's
// datagram limit in place of udp.toml's 64KB; STRATA_SCALE_HEAPPROFILE
// (a file name) writes a heap profile once the group is whole. For each size N it takes the group through sequential
// joins, min(50, N/2) members joining at once, a steady light load, the
// crash of a member, the crash of the coordinator, a partition into two
// halves that heals and merges, and a graceful leave. After each event it
// waits (in virtual time, by condition) for one view of exactly the live
// members, and fails if that does not come within a generous bound (split
// brain or no convergence). It logs one row per N: messages and bytes per
// join (counted on SIM's network, a multicast once as one datagram),
// STABLE's bytes per second under the load beside the application's, the
// virtual time to one view after each event, and the live heap per member.

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// scaleSizes returns the group sizes of STRATA_SCALE, or nil.
func scaleSizes(t *testing.T) []int {
	s := os.Getenv("STRATA_SCALE")
	if s == "" {
		return nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "STRATA_SCALE: a comma-separated list of group sizes")
		require.GreaterOrEqual(t, n, 8, "STRATA_SCALE: sizes of at least 8")
		out = append(out, n)
	}
	return out
}

// TestScale is the scale suite (see the top of this file). Run it with
// STRATA_SCALE=64,128 go test -race=false -run TestScale -v ./protocols/all.
func TestScale(t *testing.T) {
	sizes := scaleSizes(t)
	if len(sizes) == 0 {
		t.Skip("STRATA_SCALE not set (for example STRATA_SCALE=64,128)")
	}
	var rows []string
	for _, n := range sizes {
		t.Run(fmt.Sprint("N=", n), func(t *testing.T) {
			var row string
			wall := time.Now() // outside the bubble: the wall clock
			synctest.Test(t, func(t *testing.T) { row = runScale(t, n) })
			row += fmt.Sprintf(" | %s", time.Since(wall).Round(time.Second))
			t.Logf("\n%s\n%s", scaleHeader, row)
			rows = append(rows, row)
		})
	}
	t.Logf("\n%s\n%s", scaleHeader, strings.Join(rows, "\n"))
}

// scaleHeader heads the rows: per join (the sequential ones on average,
// the last of them, and those of the burst) the packets sent, their bytes
// (a multicast once), the bytes delivered (a multicast once per receiver)
// and of those GMS's and PING's (gms+ping); views: how many views the
// burst took; STABLE's and the
// application's bytes sent per second under the load, and STABLE's share;
// the virtual seconds from each event to one view (join: the last
// sequential one); the live heap per member; the wall time of the run.
const scaleHeader = "    N | per join: pkts    bytes delivered  gms+ping | last join: pkts bytes delivered gms+ping | burst: pkts bytes delivered gms+ping views |" +
	" STABLE B/s app B/s  share | to one view (s): join burst crash coord merge leave |  heap/member | wall"

// traffic counts the packets on the network by the protocol they belong
// to: the control protocol whose header they carry, or the application's
// (a payload and no control header; NAKACK's and UNICAST2's own control
// messages count as theirs).
type traffic struct {
	msgs, bytes [64]atomic.Int64 // by protocol id (0: the application); a multicast once
	dlv         [64]atomic.Int64 // bytes handed to receivers: a multicast once per receiver
}

// class is the protocol id a packet is counted under.
func class(m *stack.Message) uint16 {
	for _, id := range []uint16{stack.IDGMS, stack.IDSTABLE, stack.IDMERGE3, stack.IDFDALL, stack.IDVerifySuspect, stack.IDPING, stack.IDMFC, stack.IDUFC} {
		if m.Header(id) != nil {
			return id
		}
	}
	if len(m.Payload) > 0 {
		return 0
	}
	for _, id := range []uint16{stack.IDNAKACK, stack.IDUNICAST2, stack.IDFRAG} {
		if m.Header(id) != nil {
			return id
		}
	}
	return 0
}

func (tr *traffic) tap(m *stack.Message, size, receivers int) {
	c := class(m)
	tr.msgs[c].Add(1)
	tr.bytes[c].Add(int64(size))
	tr.dlv[c].Add(int64(size * receivers))
}

// snapshot is the traffic counted so far.
type snapshot struct{ msgs, bytes, dlv [64]int64 }

func (tr *traffic) snap() snapshot {
	var s snapshot
	for i := range tr.msgs {
		s.msgs[i], s.bytes[i], s.dlv[i] = tr.msgs[i].Load(), tr.bytes[i].Load(), tr.dlv[i].Load()
	}
	return s
}

// cost is traffic over a stretch of a run: packets, bytes sent and
// delivered, and the bytes of GMS and discovery delivered (the join's own
// traffic, without the periodic traffic of the other protocols that falls
// into the stretch).
type cost struct{ msgs, bytes, dlv, join int64 }

// since returns the traffic of every class since s.
func (tr *traffic) since(s snapshot) cost {
	now := tr.snap()
	var c cost
	for i := range now.msgs {
		c.msgs += now.msgs[i] - s.msgs[i]
		c.bytes += now.bytes[i] - s.bytes[i]
		c.dlv += now.dlv[i] - s.dlv[i]
	}
	for _, id := range []uint16{stack.IDGMS, stack.IDPING} {
		c.join += now.dlv[id] - s.dlv[id]
	}
	return c
}

// byClass lists the traffic since s by protocol.
func (tr *traffic) byClass(s snapshot) string {
	now := tr.snap()
	var b strings.Builder
	for i := range now.msgs {
		if m := now.msgs[i] - s.msgs[i]; m > 0 {
			name := "app"
			if i > 0 {
				name = stack.HeaderIDs()[uint16(i)]
			}
			fmt.Fprintf(&b, "%s %d %d %d; ", name, m, now.bytes[i]-s.bytes[i], now.dlv[i]-s.dlv[i])
		}
	}
	return b.String()
}

// per divides c by n (joins).
func (c cost) per(n int) cost {
	return cost{c.msgs / int64(n), c.bytes / int64(n), c.dlv / int64(n), c.join / int64(n)}
}

func (c cost) String() string { return fmt.Sprintf("%5d %8d %9d %9d", c.msgs, c.bytes, c.dlv, c.join) }

// sinceOf returns the bytes of class id since s.
func (tr *traffic) sinceOf(s snapshot, id uint16) int64 {
	return tr.bytes[id].Load() - s.bytes[id]
}

// scaleGroup is one run's members.
type scaleGroup struct {
	t    *testing.T
	net  *sim.Network
	data []byte
	vars map[string]string
	chs  []*stack.Channel
	dead []bool
}

func (g *scaleGroup) add() *stack.Channel {
	i := len(g.chs)
	sc, err := stack.ParseConfigVars("udp.toml", g.data, g.vars)
	require.NoError(g.t, err)
	ch, err := stack.New(stack.FromConfig(sc), stack.WithName(fmt.Sprint("m", i)), stack.WithReceiver(stack.ReceiverFuncs{}), stack.WithSeed(uint64(i+1)))
	require.NoError(g.t, err)
	g.chs, g.dead = append(g.chs, ch), append(g.dead, false)
	return ch
}

func (g *scaleGroup) alive() []*stack.Channel {
	var out []*stack.Channel
	for i, ch := range g.chs {
		if !g.dead[i] {
			out = append(out, ch)
		}
	}
	return out
}

// describeViews summarises the views chs hold, for a failure message.
func describeViews(chs []*stack.Channel) string {
	count := map[string]int{}
	for _, ch := range chs {
		v := ch.View()
		k := "none"
		if v != nil {
			k = fmt.Sprintf("%s (%d members)", v.ID, v.Size())
		}
		count[k]++
	}
	var b strings.Builder
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range count {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "\n  %d members hold %s", count[k], k)
	}
	return b.String()
}

// converge waits until chs hold one view of exactly them and returns how
// long that took from start; it fails the run after bound.
func (g *scaleGroup) converge(start time.Time, bound time.Duration, chs []*stack.Channel, what string) time.Duration {
	g.t.Helper()
	if !waitUntil(bound-time.Since(start), func() bool { return stacktest.SameView(chs...) }) {
		g.t.Fatalf("%s: no single view of the %d members within %s (split brain or no convergence):%s", what, len(chs), bound, describeViews(chs))
	}
	return time.Since(start)
}

func (g *scaleGroup) coordinator() int {
	v := g.alive()[0].View()
	for i, ch := range g.chs {
		if !g.dead[i] && ch.Address() == v.Coordinator() {
			return i
		}
	}
	g.t.Fatal("no live coordinator")
	return -1
}

// runScale runs the suite at n members and returns its table row.
func runScale(t *testing.T, n int) string {
	const bound = 5 * time.Minute
	var tr traffic
	g := &scaleGroup{t: t, net: stacktest.NewNetwork(t, 1)}
	g.net.SetTap(tr.tap)
	g.data = simStack(t, "udp.toml", "")
	if b := os.Getenv("STRATA_SCALE_MAX_BUNDLE_SIZE"); b != "" {
		// Smaller datagrams ("2KB"): control messages go in more parts,
		// and FRAG cuts the load's messages to fit.
		d := strings.Replace(string(g.data), `max_bundle_size = "64KB"`, fmt.Sprintf("max_bundle_size = %q", b), 1)
		d = strings.Replace(d, `frag_size = "60KB"`, `frag_size = "512B"`, 1)
		require.Contains(t, d, b)
		g.data = []byte(d)
	}
	g.vars = map[string]string{"STRATA_SIM_NETWORK": g.net.Name()}
	defer func() {
		for i := len(g.chs) - 1; i >= 0; i-- {
			_ = g.chs[i].Close()
		}
	}()
	heap0 := liveHeap()
	burst := min(50, n/2)
	ctx := context.Background()

	// Sequential joins, each waited for until every member holds the view;
	// the last one's cost and time are logged beside the average.
	seq := n - burst
	var joinTime time.Duration
	s0 := tr.snap()
	var last cost
	var lastSnap snapshot
	for i := range seq {
		sl := tr.snap()
		lastSnap = sl
		start := time.Now()
		require.NoError(t, g.add().Connect(ctx, "scale"), "member %d joins", i)
		joinTime = g.converge(start, bound, g.alive(), fmt.Sprintf("join of member %d", i))
		last = tr.since(sl)
		if (i+1)%100 == 0 {
			t.Logf("N=%d: %d members joined one by one", n, i+1) // progress, for long runs
		}
	}
	seqCost := tr.since(s0).per(seq)
	t.Logf("N=%d: the last sequential join by protocol (packets, bytes sent, bytes delivered): %s", n, tr.byClass(lastSnap))

	// burst members connect at once.
	s1 := tr.snap()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	var joiners []*stack.Channel
	for range burst {
		joiners = append(joiners, g.add())
	}
	v0 := g.chs[0].View().ID.Seq
	for _, ch := range joiners {
		wg.Go(func() { errs <- ch.Connect(ctx, "scale") })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a member of the burst joins")
	}
	burstTime := g.converge(start, bound, g.alive(), fmt.Sprintf("%d joining at once", burst))
	burstCost := tr.since(s1).per(burst)
	burstViews := g.chs[0].View().ID.Seq - v0
	heap := (max(liveHeap(), heap0) - heap0) / uint64(n)
	if f := os.Getenv("STRATA_SCALE_HEAPPROFILE"); f != "" {
		// The live heap of the whole group here, for go tool pprof.
		out, err := os.Create(f)
		require.NoError(t, err)
		require.NoError(t, pprof.WriteHeapProfile(out))
		require.NoError(t, out.Close())
	}

	// A steady light load: four members multicast 1 KB every 100 ms (40
	// KB/s) for 70 s; STABLE's bytes beside the application's over the
	// last 30 s. The first 40 s are past every member's first vote to this
	// coordinator (whole digests, N entries from each of N members, once;
	// votes go every 10-30 s), so the window shows the steady state. Every member keeps what it received until STABLE purges
	// it (NAKACK: any member retransmits), so the load's heap grows with N
	// times the rate: heavier, 512 members do not fit in 8 GB.
	stop := make(chan struct{})
	var load sync.WaitGroup
	for _, ch := range g.chs[:4] {
		load.Go(func() {
			tk := time.NewTicker(100 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					_ = ch.Send(ctx, stack.NewMessage(stack.Address{}, make([]byte, 1000)))
				}
			}
		})
	}
	time.Sleep(40 * time.Second) // into the steady state
	s2 := tr.snap()
	const window = 30 * time.Second
	time.Sleep(window)
	stableBps := float64(tr.sinceOf(s2, stack.IDSTABLE)) / window.Seconds()
	appBps := float64(tr.sinceOf(s2, 0)) / window.Seconds()
	close(stop)
	load.Wait()

	// The crash of a member (not the coordinator).
	victim := len(g.chs) - 1 - n/3
	if victim == g.coordinator() {
		victim--
	}
	start = time.Now()
	g.net.Cut(g.chs[victim].Address())
	g.dead[victim] = true
	crashTime := g.converge(start, bound, g.alive(), "crash of a member")

	// The crash of the coordinator.
	c := g.coordinator()
	start = time.Now()
	g.net.Cut(g.chs[c].Address())
	g.dead[c] = true
	coordTime := g.converge(start, bound, g.alive(), "crash of the coordinator")

	// A partition into halves, which then heals and merges.
	live := g.alive()
	left, right := live[:len(live)/2], live[len(live)/2:]
	addrs := func(chs []*stack.Channel) []stack.Address {
		var out []stack.Address
		for _, ch := range chs {
			out = append(out, ch.Address())
		}
		return out
	}
	g.net.Partition(addrs(left), addrs(right))
	start = time.Now()
	g.converge(start, bound, left, "the left half of the partition")
	g.converge(start, bound, right, "the right half of the partition")
	g.net.Heal()
	start = time.Now()
	mergeTime := g.converge(start, 2*bound, live, "merge after the partition healed")

	// A graceful leave.
	leaver := len(g.chs) - 1 - n/5
	for g.dead[leaver] || leaver == g.coordinator() {
		leaver--
	}
	start = time.Now()
	require.NoError(t, g.chs[leaver].Disconnect(ctx), "a member leaves")
	g.dead[leaver] = true
	leaveTime := g.converge(start, bound, g.alive(), "graceful leave")

	secs := func(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }
	return fmt.Sprintf("%5d | %s | %s | %s %5d | %10.0f %7.0f %6.1f%% | %5s %5s %5s %5s %5s %5s | %7.1f KB",
		n, seqCost, last, burstCost, burstViews,
		stableBps, appBps, 100*stableBps/(stableBps+appBps),
		secs(joinTime), secs(burstTime), secs(crashTime), secs(coordTime), secs(mergeTime), secs(leaveTime),
		float64(heap)/1024)
}
