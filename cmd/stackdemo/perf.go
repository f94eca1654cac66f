package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/strata-go/strata/internal/cpustat"
	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/rpc"
	"github.com/strata-go/strata/stack"
)

// perfOptions are stackdemo perf's flags.
type perfOptions struct {
	config    string
	members   int
	mode      string
	size      int
	count     int
	senders   int
	oob       bool
	json      bool
	timeout   time.Duration
	join      bool
	cluster   string
	name      string
	cpuProf   string
	memProf   string
	mutexProf string
	traceFile string // -trace FILE: the measured round's last second as an execution trace
	diag      string // -diag host:port: member i serves its diagnostics on port+i
	warmup    int    // -warmup N: an uncounted first round of N messages (calls) per sender
	alloc     string // -alloc slab|each: how a sender makes its payloads and messages
}

// Message kinds in the first byte of a perf payload.
const (
	kindData byte = 1
	kindRsp  byte = 3         // an rpc answer (-mode rpc)
	kindGo   byte = 4         // -join: the first member starts the run
	kindAck  byte = 5         // -join: a receiver tells a sender how many it has (seqno field)
	kindDone byte = 6         // -join: a member has everything it expects (seqno field: the round, 0 warm-up, 1 measured)
	kindWarm byte = 7         // -warmup: a message of the uncounted first round
	perfHdr       = 1 + 4 + 8 // kind, sender index, seqno
)

// perfMember is one member of the run: its channel and what it received.
type perfMember struct {
	idx   int
	ch    *stack.Channel
	mu    sync.Mutex
	from  []perfSender // by sender index (grown on demand)
	bytes atomic.Int64
	count atomic.Int64
	errs  []string
	wake  chan struct{}
	d     *rpc.Dispatcher // -mode rpc
	first time.Time
	last  time.Time
	oob   bool

	// -join mode
	joined bool
	start  chan struct{}
	acks   map[int]int64  // per receiver (view index): what it said it has of ours
	dones  map[int]uint64 // per member: the rounds it has finished (kindDone)
}

// perfSender is what a member has of one sender.
type perfSender struct {
	next uint64 // the next seqno expected (regular messages)
	got  int64  // messages received
	warm int64  // warm-up messages received (-warmup)
}

// maxPerfSenders bounds the sender index a perf message may carry.
const maxPerfSenders = 1 << 16

// senderLocked returns what pm has of sender (nil for an index out of
// range); callers hold pm.mu.
func (pm *perfMember) senderLocked(sender int) *perfSender {
	if sender < 0 || sender >= maxPerfSenders {
		return nil
	}
	if sender >= len(pm.from) {
		pm.from = append(pm.from, make([]perfSender, sender+1-len(pm.from))...)
	}
	return &pm.from[sender]
}

func (pm *perfMember) ViewAccepted(*stack.View) {}

func (pm *perfMember) Receive(m *stack.Message) {
	p := m.Payload
	if len(p) < perfHdr {
		return
	}
	sender := int(binary.BigEndian.Uint32(p[1:]))
	seq := binary.BigEndian.Uint64(p[5:])
	switch p[0] {
	case kindGo:
		pm.mu.Lock()
		if pm.start != nil {
			close(pm.start)
			pm.start = nil
		}
		pm.mu.Unlock()
		return
	case kindAck, kindDone:
		pm.mu.Lock()
		if p[0] == kindAck {
			pm.acks[sender] = max(pm.acks[sender], int64(seq))
		} else {
			pm.dones[sender] = max(pm.dones[sender], seq+1)
		}
		pm.mu.Unlock()
		select {
		case pm.wake <- struct{}{}:
		default:
		}
		return
	case kindWarm:
		pm.mu.Lock()
		if ps := pm.senderLocked(sender); ps != nil {
			ps.warm++
		}
		pm.mu.Unlock()
		select {
		case pm.wake <- struct{}{}:
		default:
		}
		return
	}
	now := time.Now()
	pm.mu.Lock()
	if pm.first.IsZero() {
		pm.first = now
	}
	pm.last = now
	pm.takeLocked(sender, seq)
	// Counted before the lock goes: whoever sees the message taken (the
	// wait for the last one) sees it in the totals too.
	pm.counted(1, int64(len(p)))
	pm.mu.Unlock()
}

// ReceiveBatch takes a batch as JGroups' perf driver (McastPerf) does: one
// lock and one clock reading per batch for its data messages, not one per
// message, so the driver's own bookkeeping weighs the same on both sides.
// Other kinds (rare) go through Receive.
func (pm *perfMember) ReceiveBatch(b *stack.Batch) {
	var n, bytes, warm int64
	pm.mu.Lock()
	for _, m := range b.Msgs {
		p := m.Payload
		if len(p) >= perfHdr && p[0] == kindWarm {
			if ps := pm.senderLocked(int(binary.BigEndian.Uint32(p[1:]))); ps != nil {
				ps.warm++
				warm++
			}
			continue
		}
		if len(p) < perfHdr || p[0] != kindData {
			continue
		}
		if n == 0 && pm.first.IsZero() {
			pm.first = time.Now()
		}
		pm.takeLocked(int(binary.BigEndian.Uint32(p[1:])), binary.BigEndian.Uint64(p[5:]))
		n, bytes = n+1, bytes+int64(len(p))
	}
	if n > 0 {
		pm.last = time.Now()
		pm.counted(n, bytes) // before the lock goes, as in Receive
	}
	pm.mu.Unlock()
	for _, m := range b.Msgs {
		if p := m.Payload; len(p) >= perfHdr && p[0] != kindData && p[0] != kindWarm {
			pm.Receive(m)
		}
	}
	if warm > 0 {
		select {
		case pm.wake <- struct{}{}:
		default:
		}
	}
}

// takeLocked counts a data message from sender and checks its seqno;
// callers hold pm.mu.
func (pm *perfMember) takeLocked(sender int, seq uint64) {
	ps := pm.senderLocked(sender)
	if ps == nil {
		if len(pm.errs) < 10 {
			pm.errs = append(pm.errs, fmt.Sprintf("member %d: a message from member %d, out of range", pm.idx, sender))
		}
		return
	}
	ps.got++
	if !pm.oob {
		if seq != ps.next {
			if len(pm.errs) < 10 {
				pm.errs = append(pm.errs, fmt.Sprintf("member %d: from member %d got seqno %d, expected %d", pm.idx, sender, seq, ps.next))
			}
		}
		ps.next = seq + 1
	}
}

// counted adds n data messages of bytes in all, and wakes the waiters on
// every 64th message.
func (pm *perfMember) counted(n, bytes int64) {
	pm.bytes.Add(bytes)
	if c := pm.count.Add(n); c/64 != (c-n)/64 {
		select {
		case pm.wake <- struct{}{}:
		default:
		}
	}
}

// control is a perf control message of kind from member idx.
func control(kind byte, idx int, seq uint64) []byte {
	b := make([]byte, perfHdr)
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], uint32(idx))
	binary.BigEndian.PutUint64(b[5:], seq)
	return b
}

// answer is -mode rpc's handler: it answers a request with the request's
// sender index and seqno.
func (pm *perfMember) answer(_ context.Context, req *stack.Message) ([]byte, error) {
	p := req.Payload
	if len(p) < perfHdr {
		return nil, fmt.Errorf("request of %d bytes", len(p))
	}
	return control(kindRsp, pm.idx, binary.BigEndian.Uint64(p[5:])), nil
}

// attachRPC puts an rpc Dispatcher on pm's channel (-mode rpc), with pm as
// the receiver of everything else.
func (pm *perfMember) attachRPC(o perfOptions) error {
	if o.mode != "rpc" {
		return nil
	}
	d, err := rpc.New(pm.ch, pm.answer, rpc.WithReceiver(pm))
	pm.d = d
	return err
}

// call makes one synchronous rpc and checks the answer.
func (pm *perfMember) call(ctx context.Context, to stack.Address, payload []byte, seq uint64) error {
	rsp, err := pm.d.Call(ctx, to, payload)
	if err != nil {
		return fmt.Errorf("rpc %d: %w", seq, err)
	}
	if len(rsp) < perfHdr || rsp[0] != kindRsp || binary.BigEndian.Uint64(rsp[5:]) != seq {
		return fmt.Errorf("rpc %d: wrong answer %x", seq, rsp)
	}
	return nil
}

func (pm *perfMember) gotFrom(sender int) int64 { return pm.received(kindData, sender) }

// received returns how many messages of kind (kindData or kindWarm) pm has
// received from sender.
func (pm *perfMember) received(kind byte, sender int) int64 {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	ps := pm.senderLocked(sender)
	switch {
	case ps == nil:
		return 0
	case kind == kindWarm:
		return ps.warm
	}
	return ps.got
}

// perfResult is what perf reports (also as JSON).
type perfResult struct {
	Config    string         `json:"config"`
	Mode      string         `json:"mode"`
	Members   int            `json:"members"`
	Senders   int            `json:"senders"`
	Size      int            `json:"size"`
	Count     int            `json:"count"`
	Warmup    int            `json:"warmup"`
	Alloc     string         `json:"alloc"` // -alloc: how the senders made payloads and messages
	Seconds   float64        `json:"seconds"`
	PerMember []memberResult `json:"per_member"`
	TotalMsgs int64          `json:"total_msgs_received"`
	MsgsPerS  float64        `json:"total_msgs_per_sec"`
	MBPerS    float64        `json:"total_mb_per_sec"`
	Latency   *latency       `json:"rpc_latency_us,omitempty"`
	CallsPerS float64        `json:"rpc_calls_per_sec,omitempty"`
	// CPUSeconds is this process's CPU time (user and system) during the
	// measured round, and CPUMicrosPerMsg that per message (or call) sent
	// by all senders: what the round cost, which the host's share of the
	// cores does not change. With -join each process reports its own
	// share; the processes' figures add up to the group's.
	CPUSeconds      float64 `json:"cpu_seconds"`
	CPUMicrosPerMsg float64 `json:"cpu_us_per_msg_sent"`
	// StealShare is the share of the machine's CPU time the host gave to
	// others during the round (Linux; absent elsewhere): above a few
	// percent the figures are not a quiet machine's.
	StealShare *float64 `json:"steal_share,omitempty"`
	// GC is what the Go collector did during the round, and how it was
	// paced: in a steady send loop it is much of the CPU per message.
	GC     gcCost           `json:"gc"`
	Stats  map[string]int64 `json:"stats"`
	Errors []string         `json:"errors,omitempty"`
}

type memberResult struct {
	Member   int     `json:"member"`
	Msgs     int64   `json:"msgs_received"`
	MsgsPerS float64 `json:"msgs_per_sec"`
	MBPerS   float64 `json:"mb_per_sec"`
}

type latency struct {
	P50, P90, P99, Max float64
}

func cmdPerf(args []string, stdout, stderr io.Writer) int {
	var o perfOptions
	fl := flag.NewFlagSet("perf", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.StringVar(&o.config, "config", "", "stack config FILE (default: the embedded default)")
	fl.IntVar(&o.members, "members", 4, "members to start in this process, on loopback")
	fl.StringVar(&o.mode, "mode", "multicast", "multicast | unicast | anycast | rpc")
	fl.IntVar(&o.size, "size", 1000, "message size in bytes")
	fl.IntVar(&o.count, "count", 20000, "messages per sender")
	fl.IntVar(&o.senders, "senders", 0, "members that send (0: all)")
	fl.BoolVar(&o.oob, "oob", false, "send out of band (no order check)")
	fl.BoolVar(&o.json, "json", false, "print one JSON object")
	fl.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	fl.BoolVar(&o.join, "join", false, "this process is one member: start -members N processes (or hosts) with the same flags; the run starts when all have joined")
	fl.StringVar(&o.cluster, "cluster", "perf", "with -join: the group to join")
	fl.StringVar(&o.name, "name", "", "with -join: this member's name (default: host-pid)")
	fl.StringVar(&o.cpuProf, "cpuprofile", "", "write a CPU profile of the run to FILE (go tool pprof)")
	fl.StringVar(&o.memProf, "memprofile", "", "write an allocation profile, taken after the run, to FILE")
	fl.StringVar(&o.mutexProf, "mutexprofile", "", "write a profile of lock contention during the run (every contended Unlock) to FILE")
	fl.StringVar(&o.traceFile, "trace", "", "write an execution trace of the measured round's last second to FILE (go tool trace FILE; go tool trace -pprof=sched FILE: where goroutines waited to run)")
	fl.IntVar(&o.warmup, "warmup", 0, "an uncounted first round of N messages (calls) per sender before the measured one, as bench/jgroups5's driver has (0: none)")
	fl.StringVar(&o.alloc, "alloc", "slab", "how a sender makes payloads and messages: slab (carved from a stack.Slab, as a Go sender that cares does) | each (one make per message, as bench/jgroups5's driver allocates a byte[] and a message each)")
	fl.StringVar(&o.diag, "diag", "", "serve diagnostics (metrics, /debug/strata, pprof) on host:port, member i on port+i (port 0: free ports), for stackdemo probe")
	if err := fl.Parse(args); err != nil {
		return exitConfig
	}
	switch {
	case o.members < 2:
		fmt.Fprintln(stderr, "stackdemo perf: -members must be at least 2")
		return exitConfig
	case o.size < perfHdr || o.size > 1<<20:
		fmt.Fprintf(stderr, "stackdemo perf: -size must be %d..%d\n", perfHdr, 1<<20)
		return exitConfig
	case o.count < 1:
		fmt.Fprintln(stderr, "stackdemo perf: -count must be at least 1")
		return exitConfig
	case o.warmup < 0:
		fmt.Fprintln(stderr, "stackdemo perf: -warmup must be 0 or more")
		return exitConfig
	case !slices.Contains([]string{"multicast", "unicast", "anycast", "rpc"}, o.mode):
		fmt.Fprintf(stderr, "stackdemo perf: unknown -mode %q (multicast, unicast, anycast or rpc)\n", o.mode)
		return exitConfig
	case o.alloc != "slab" && o.alloc != "each":
		fmt.Fprintf(stderr, "stackdemo perf: unknown -alloc %q (slab or each)\n", o.alloc)
		return exitConfig
	}
	if o.senders <= 0 || o.senders > o.members {
		o.senders = o.members
	}
	run := runPerf
	if o.join {
		run = runJoin
	}
	stopProf, err := startProfiles(o)
	if err != nil {
		fmt.Fprintln(stderr, "stackdemo perf:", err)
		return exitConfig
	}
	res, err := run(o, stderr)
	if perr := stopProf(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		var ce *stack.ConfigError
		fmt.Fprintln(stderr, "stackdemo perf:", err)
		if errors.As(err, &ce) {
			return exitConfig
		}
		return exitFail
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	} else {
		printPerf(stdout, res)
	}
	if len(res.Errors) > 0 {
		for _, e := range res.Errors {
			fmt.Fprintln(stderr, "stackdemo perf: FAILED:", e)
		}
		return exitFail
	}
	return exitOK
}

// startProfiles starts the CPU profile of -cpuprofile and the contention
// profile of -mutexprofile; the function it returns stops them and writes
// those and the allocation profile of -memprofile.
func startProfiles(o perfOptions) (func() error, error) {
	var cpu *os.File
	if o.cpuProf != "" {
		f, err := os.Create(o.cpuProf)
		if err != nil {
			return nil, fmt.Errorf("-cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("-cpuprofile: %w", err)
		}
		cpu = f
	}
	rate := -1 // the mutex profile's sampling rate before the run, when -mutexprofile changes it
	if o.mutexProf != "" {
		rate = runtime.SetMutexProfileFraction(1)
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		errs = append(errs, writeProfile("allocs", o.memProf, "-memprofile"), writeProfile("mutex", o.mutexProf, "-mutexprofile"))
		if rate >= 0 {
			runtime.SetMutexProfileFraction(rate)
		}
		return errors.Join(errs...)
	}, nil
}

// writeProfile writes the runtime profile name to file, unless file is ""
// (the flag was not given); errors name the flag.
func writeProfile(name, file, flag string) error {
	if file == "" {
		return nil
	}
	f, err := os.Create(file)
	if err == nil {
		err = errors.Join(pprof.Lookup(name).WriteTo(f, 0), f.Close())
	}
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	return nil
}

// perfVars keeps the run on this host and away from other programs: a
// free port and a multicast group of its own.
func perfVars() map[string]string {
	ports := []int{7800, 45588}
	for i := range ports {
		// Held open until both are picked, so they differ.
		if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err == nil {
			ports[i] = c.LocalAddr().(*net.UDPAddr).Port
			defer c.Close()
		}
	}
	return map[string]string{
		"STRATA_BIND_PORT":     strconv.Itoa(ports[0]),
		"STRATA_MCAST_ADDR":    fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT":    strconv.Itoa(ports[1]),
		"STRATA_INITIAL_HOSTS": fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"STRATA_SIM_NETWORK":   fmt.Sprint("perf-", rand.Uint32()),
	}
}

func runPerf(o perfOptions, stderr io.Writer) (*perfResult, error) {
	data, name, err := readConfig(o.config)
	if err != nil {
		return nil, err
	}
	vars := perfVars()
	for k := range vars {
		if v, ok := os.LookupEnv(k); ok {
			vars[k] = v
		}
	}
	sc, err := stack.ParseConfigVars(name, data, vars)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	ms := make([]*perfMember, o.members)
	for i := range ms {
		// Anycast spreads a sender's messages over several receivers, so
		// each sees a rising but not contiguous sequence: count only.
		pm := &perfMember{idx: i, wake: make(chan struct{}, 1), oob: o.oob || o.mode == "anycast"}
		addr, err := nthDiagAddr(o.diag, i)
		if err != nil {
			return nil, err
		}
		ch, err := stack.New(withDiag(addr, stack.FromConfig(sc), stack.WithName(fmt.Sprint("perf-", i)), stack.WithReceiver(pm))...)
		if err != nil {
			return nil, err
		}
		defer ch.Close()
		printDiag(stderr, ch)
		pm.ch = ch
		ms[i] = pm
		if err := pm.attachRPC(o); err != nil {
			return nil, err
		}
		if pm.d != nil {
			defer pm.d.Close()
		}
	}
	if _, err := groupfc.Of(ms[0].ch); o.mode == "anycast" && err != nil {
		return nil, fmt.Errorf("-mode anycast: %w", err)
	}
	cluster := fmt.Sprint("perf-", rand.Uint32())
	errc := make(chan error, len(ms))
	for _, pm := range ms {
		go func() { errc <- pm.ch.Connect(ctx, cluster) }()
	}
	for range ms {
		if err := <-errc; err != nil {
			return nil, err
		}
	}
	if stack.Of(ms[0].ch).Find("GMS") == nil {
		// No membership protocol (configs/sim.toml): install one view of
		// every member, as the tests do.
		addrs := make([]stack.Address, len(ms))
		for i, pm := range ms {
			addrs[i] = pm.ch.Address()
		}
		v := stack.NewView(addrs[0], 2, addrs...)
		for _, pm := range ms {
			if err := stack.Of(pm.ch).InstallView(ctx, v); err != nil {
				return nil, err
			}
		}
	}
	if err := waitView(ctx, ms); err != nil {
		return nil, err
	}
	progress := isTerminal(stderr)
	if o.warmup > 0 {
		// Not counted: every member has all of it before the measured
		// round starts.
		if _, err := drive(ctx, o, ms, stderr, progress, kindWarm, o.warmup); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		if err := warmedUp(o, ms); err != nil {
			return nil, err
		}
	}
	round, err := startRound(o)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lat, sendErr := drive(ctx, o, ms, stderr, progress, kindData, o.count)
	el := time.Since(start)
	res := &perfResult{Config: name, Mode: o.mode, Members: o.members, Senders: o.senders, Size: o.size, Count: o.count, Warmup: o.warmup, Alloc: o.alloc, Seconds: el.Seconds(), Latency: lat, Stats: map[string]int64{}}
	if err := round.finish(res, o.senders*o.count); err != nil {
		return nil, err
	}
	if sendErr != nil {
		res.Errors = append(res.Errors, sendErr.Error())
	}
	for _, pm := range ms {
		pm.mu.Lock()
		res.Errors = append(res.Errors, pm.errs...)
		span := pm.last.Sub(pm.first).Seconds()
		pm.mu.Unlock()
		n := pm.count.Load()
		mr := memberResult{Member: pm.idx, Msgs: n}
		if span > 0 {
			mr.MsgsPerS = float64(n) / span
			mr.MBPerS = float64(pm.bytes.Load()) / span / 1e6
		}
		res.PerMember = append(res.PerMember, mr)
		res.TotalMsgs += n
	}
	if o.mode == "rpc" {
		res.CallsPerS = float64(o.senders*o.count) / el.Seconds()
	}
	res.MsgsPerS = float64(res.TotalMsgs) / el.Seconds()
	res.MBPerS = float64(res.TotalMsgs) * float64(o.size) / el.Seconds() / 1e6
	res.Errors = append(res.Errors, checkCounts(o, ms)...)
	for _, pm := range ms {
		addStats(res.Stats, pm.ch)
	}
	return res, nil
}

// roundMeter reads what a measured round costs: this process's CPU time,
// and the share of the machine's CPU time the host took meanwhile; with
// -trace it also keeps the round's execution trace in a flight recorder,
// whose last second it writes at the end of the round (a whole round's
// trace would be gigabytes).
type roundMeter struct {
	mach      cpustat.Machine
	machErr   error
	cpu       time.Duration
	gc        gcSample
	fr        *trace.FlightRecorder
	traceFile string
}

// startRound starts reading a round's cost, and its trace with -trace.
func startRound(o perfOptions) (*roundMeter, error) {
	r := &roundMeter{traceFile: o.traceFile}
	if o.traceFile != "" {
		r.fr = trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: time.Second, MaxBytes: 256 << 20})
		if err := r.fr.Start(); err != nil {
			return nil, fmt.Errorf("-trace: %w", err)
		}
	}
	r.mach, r.machErr = cpustat.ReadMachine()
	r.gc = readGC()
	r.cpu = cpustat.Process()
	return r, nil
}

// finish fills res's cost fields at the end of a round of sent messages
// (or calls) from every sender, and writes the trace of -trace.
func (r *roundMeter) finish(res *perfResult, sent int) error {
	cpu := cpustat.Process() - r.cpu
	res.GC = readGC().since(r.gc)
	res.CPUSeconds = cpu.Seconds()
	if sent > 0 {
		res.CPUMicrosPerMsg = float64(cpu.Microseconds()) / float64(sent)
	}
	if m, err := cpustat.ReadMachine(); err == nil && r.machErr == nil {
		share := m.Sub(r.mach).StealShare()
		res.StealShare = &share
	}
	if r.fr == nil {
		return nil
	}
	defer r.fr.Stop()
	f, err := os.Create(r.traceFile)
	if err == nil {
		_, err = r.fr.WriteTo(f)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("-trace: %w", err)
	}
	return nil
}

// reportedStats are the counters a perf run adds up over its members and
// reports: losses and their repair, flow control's waits, and the
// transport's system calls and bundles.
var reportedStats = map[string]bool{
	"retransmissions": true, "xmit_reqs_sent": true, "resends_of_unacked": true,
	"dropped_queue_full": true, "dropped_queue_full_regular": true, "dropped_oversized": true,
	"dropped_buffer_full": true, "socket_errors": true, "late_responses": true,
	"echo_waits": true, "echo_wait_timeouts": true,
	"blockings": true, "blocked_time_ns": true, "blocked_sends": true, "blocked_ms": true, // blocked_ms: GROUPFC's
	"credits_granted_on_request": true, "credit_requests_sent": true,
	"datagrams_sent": true, "datagrams_received": true, "send_calls": true, "recv_calls": true,
	"bundles_sent": true, "bundle_msgs_sent": true,
}

// addStats adds ch's counters named in reportedStats to stats, keyed
// PROTOCOL.counter.
func addStats(stats map[string]int64, ch *stack.Channel) {
	for _, ps := range ch.Stats() {
		for _, s := range ps.Stats {
			if reportedStats[s.Name] {
				stats[ps.Protocol+"."+s.Name] += s.Value
			}
		}
	}
}

func waitView(ctx context.Context, ms []*perfMember) error {
	for {
		ok := true
		for _, pm := range ms {
			if pm.ch.View().Size() != len(ms) {
				ok = false
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the %d members did not form one view: %w", len(ms), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// receivers returns the members whose count of sender i's messages perf
// waits for and checks: its targets and, for a multicast, the sender
// itself (its own messages loop back to it, and its count includes them).
func receivers(o perfOptions, ms []*perfMember, i int) []*perfMember {
	rs := targets(o, ms, i)
	if o.mode == "multicast" {
		rs = append(rs, ms[i])
	}
	return rs
}

// warmedUp says what the warm-up round lost, if anything.
func warmedUp(o perfOptions, ms []*perfMember) error {
	if o.mode == "rpc" {
		return nil
	}
	if o.mode == "anycast" {
		if total := totalOf(o, ms, kindWarm); total != int64(o.senders*o.warmup) {
			return fmt.Errorf("warm-up: %d anycasts received, %d sent", total, o.senders*o.warmup)
		}
		return nil
	}
	for i := range o.senders {
		for _, r := range receivers(o, ms, i) {
			if got := r.received(kindWarm, i); got != int64(o.warmup) {
				return fmt.Errorf("warm-up: member %d got %d of member %d's %d messages", r.idx, got, i, o.warmup)
			}
		}
	}
	return nil
}

// targets returns, per sender, the members its messages go to.
func targets(o perfOptions, ms []*perfMember, i int) []*perfMember {
	switch o.mode {
	case "multicast":
		var out []*perfMember
		for j, pm := range ms {
			if j != i {
				out = append(out, pm)
			}
		}
		return out
	case "unicast":
		return []*perfMember{ms[(i+1)%len(ms)]}
	}
	return nil
}

// drive sends n messages (calls) of kind per sender and waits until every
// receiver has them (or the timeout).
func drive(ctx context.Context, o perfOptions, ms []*perfMember, stderr io.Writer, progress bool, kind byte, n int) (*latency, error) {
	var wg sync.WaitGroup
	var sent atomic.Int64
	errs := make(chan error, o.senders)
	var lats []time.Duration
	var lmu sync.Mutex
	for i := range o.senders {
		wg.Go(func() {
			if err := sendAll(ctx, o, ms, i, kind, n, &sent, &lats, &lmu); err != nil {
				errs <- fmt.Errorf("member %d: %w", i, err)
			}
		})
	}
	done := make(chan struct{})
	if progress {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			total := int64(o.senders * n)
			for {
				select {
				case <-done:
					fmt.Fprintln(stderr)
					return
				case <-t.C:
					fmt.Fprintf(stderr, "\rsent %d of %d", sent.Load(), total)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	if o.mode == "rpc" {
		return percentiles(lats), nil
	}
	// Wait until every receiver has every message (or the timeout).
	for o.mode == "anycast" && totalOf(o, ms, kind) < int64(o.senders*n) {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(5 * time.Millisecond):
		}
	}
	for i := range o.senders {
		for _, r := range receivers(o, ms, i) {
			for r.received(kind, i) < int64(n) {
				select {
				case <-ctx.Done():
					return nil, nil // checkCounts reports what is missing
				case <-r.wake:
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	return nil, nil
}

func sendAll(ctx context.Context, o perfOptions, ms []*perfMember, i int, kind byte, n int, sent *atomic.Int64, lats *[]time.Duration, lmu *sync.Mutex) error {
	me := ms[i]
	ts := targets(o, ms, i)
	gfc, _ := groupfc.Of(me.ch) // nil without GROUPFC: the modes that need it were refused above
	a := newPerfAlloc(o)
	for s := range n {
		buf := a.payload(kind, i, uint64(s))
		switch o.mode {
		case "rpc":
			to := ms[(i+1+rand.IntN(len(ms)-1))%len(ms)].ch.Address()
			t0 := time.Now()
			if err := me.call(ctx, to, buf, uint64(s)); err != nil {
				return err
			}
			if kind == kindWarm {
				break
			}
			lmu.Lock()
			*lats = append(*lats, time.Since(t0))
			lmu.Unlock()
		case "anycast":
			if _, err := gfc.Anycast(ctx, 0, buf); err != nil {
				return err
			}
		default:
			// No application window: the stack's flow control (UFC and
			// MFC, or GROUPFC's windows) paces the sender, as it would any
			// application's.
			dest := stack.Address{}
			if o.mode == "unicast" {
				dest = ts[0].ch.Address()
			}
			m := a.message(dest, buf)
			if o.oob {
				m.Set(stack.OOB)
			}
			if err := me.ch.Send(ctx, m); err != nil {
				return err
			}
		}
		sent.Add(1)
	}
	return nil
}

// perfAlloc makes one sending goroutine's payloads and messages. A
// message and its payload are the stack's once sent (NAKACK keeps them for
// retransmission), so neither is reused: -alloc each makes both anew per
// message, as bench/jgroups5's driver allocates a byte[] and a message
// each; -alloc slab (the default) carves them from a stack.Slab, which a
// Go sender of many small messages would use, as a JVM's allocator makes
// the per-message allocation cheap there and Go's does not.
type perfAlloc struct {
	size int
	slab *stack.Slab // nil: -alloc each
}

func newPerfAlloc(o perfOptions) perfAlloc {
	a := perfAlloc{size: o.size}
	if o.alloc != "each" {
		a.slab = new(stack.Slab)
	}
	return a
}

// payload returns a new payload of size bytes that starts with the kind,
// the sender's index and the sequence number, written only there.
func (a perfAlloc) payload(kind byte, sender int, s uint64) []byte {
	var b []byte
	if a.slab != nil {
		b = a.slab.Bytes(a.size)
	} else {
		b = make([]byte, a.size)
	}
	putPerfHeader(b, kind, sender, s)
	return b
}

// message returns a new message of buf for dest.
func (a perfAlloc) message(dest stack.Address, buf []byte) *stack.Message {
	if a.slab != nil {
		return a.slab.NewMessage(dest, buf)
	}
	return stack.NewMessage(dest, buf)
}

// putPerfHeader writes the kind, the sender's index and the sequence
// number at the start of b.
func putPerfHeader(b []byte, kind byte, sender int, s uint64) {
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], uint32(sender))
	binary.BigEndian.PutUint64(b[5:], s)
}

// checkCounts says what was lost or duplicated.
func checkCounts(o perfOptions, ms []*perfMember) []string {
	var errs []string
	if o.mode == "rpc" {
		return nil
	}
	if o.mode == "anycast" {
		if total, want := totalOf(o, ms, kindData), int64(o.senders*o.count); total != want {
			errs = append(errs, fmt.Sprintf("anycast: %d messages received, %d sent", total, want))
		}
		return errs
	}
	for i := range o.senders {
		for _, r := range receivers(o, ms, i) {
			if got := r.gotFrom(i); got != int64(o.count) {
				errs = append(errs, fmt.Sprintf("member %d got %d of member %d's %d messages", r.idx, got, i, o.count))
			}
		}
	}
	return errs
}

// totalOf is what the senders' messages of kind delivered, over all
// members (anycasts).
func totalOf(o perfOptions, ms []*perfMember, kind byte) int64 {
	var total int64
	for _, r := range ms {
		for i := range o.senders {
			total += r.received(kind, i)
		}
	}
	return total
}

func percentiles(ds []time.Duration) *latency {
	if len(ds) == 0 {
		return nil
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))].Microseconds())
	}
	return &latency{P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: float64(ds[len(ds)-1].Microseconds())}
}

func printPerf(w io.Writer, r *perfResult) {
	what := "messages"
	if r.Mode == "rpc" {
		what = "calls"
	}
	warm := ""
	if r.Warmup > 0 {
		warm = fmt.Sprintf(" (after a warm-up of %d)", r.Warmup)
	}
	fmt.Fprintf(w, "%s: %s, %d members, %d senders × %d %s of %d bytes%s, %.2fs (payloads: -alloc %s)\n", r.Config, r.Mode, r.Members, r.Senders, r.Count, what, r.Size, warm, r.Seconds, r.Alloc)
	if r.Mode == "rpc" {
		// Requests and answers go to the dispatcher, not counted as
		// messages: calls are what was measured.
		fmt.Fprintf(w, "  rpc: %.0f calls/s\n", r.CallsPerS)
		if l := r.Latency; l != nil {
			fmt.Fprintf(w, "  latency µs: p50 %.0f  p90 %.0f  p99 %.0f  max %.0f\n", l.P50, l.P90, l.P99, l.Max)
		}
	} else {
		// A member's count covers the messages the verdict checks: in one
		// process, all it delivered, its own multicasts included; with
		// -join, the other members'.
		for _, m := range r.PerMember {
			fmt.Fprintf(w, "  member %d: %d msgs, %.0f msgs/s, %.1f MB/s\n", m.Member, m.Msgs, m.MsgsPerS, m.MBPerS)
		}
		fmt.Fprintf(w, "  total: %d msgs received, %.0f msgs/s, %.1f MB/s\n", r.TotalMsgs, r.MsgsPerS, r.MBPerS)
	}
	steal := ""
	if r.StealShare != nil {
		steal = fmt.Sprintf("; the host took %.0f%% of the machine's CPU time", 100**r.StealShare)
	}
	fmt.Fprintf(w, "  cpu: %.2fs in this process, %.2f µs per %s sent%s\n", r.CPUSeconds, r.CPUMicrosPerMsg, strings.TrimSuffix(what, "s"), steal)
	fmt.Fprintf(w, "  gc: %s\n", r.GC)
	keys := make([]string, 0, len(r.Stats))
	for k := range r.Stats {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s = %d\n", k, r.Stats[k])
	}
	if len(r.Errors) == 0 {
		fmt.Fprintln(w, "  no loss, no duplicates, in order")
	}
}

// isTerminal reports whether w is a terminal (x/term asks the kernel; a
// file mode check also takes /dev/null for one).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
