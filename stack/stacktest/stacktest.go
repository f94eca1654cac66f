// Package stacktest is what every protocol's tests use: start N channels on
// a stack (usually on the in-memory SIM network), wait for conditions
// without fixed sleeps, check delivery invariants, and check that Close
// leaves no goroutine behind.
package stacktest

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
)

// Seed returns the fault seed for t: $STRATA_SEED if set, else one derived
// from the test's name. It logs the seed if the test fails, so a failure can
// be replayed with STRATA_SEED=N.
func Seed(t testing.TB) uint64 {
	t.Helper()
	var seed uint64
	if s := os.Getenv("STRATA_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("STRATA_SEED=%q: %v", s, err)
		}
		seed = v
	} else {
		h := fnv.New64a()
		h.Write([]byte(t.Name()))
		seed = h.Sum64()
	}
	LogSeedOnFailure(t, seed)
	return seed
}

// LogSeedOnFailure makes t print seed if it fails.
func LogSeedOnFailure(t testing.TB, seed uint64) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fault seed: %d (replay with STRATA_SEED=%d)", seed, seed)
		}
	})
}

// Seeds returns how many seeds a randomised test should run: $STRATA_SEEDS
// if set (for long local runs), else def.
func Seeds(def uint64) uint64 {
	if s := os.Getenv("STRATA_SEEDS"); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil && v > 0 {
			return v
		}
	}
	return def
}

var netCounter atomic.Int64

// NewNetwork creates a SIM network with a unique name and seed, closed when
// t ends.
func NewNetwork(t testing.TB, seed uint64) *sim.Network {
	t.Helper()
	name := fmt.Sprintf("%s#%d", t.Name(), netCounter.Add(1))
	n, err := sim.NewNetwork(name, seed)
	if err != nil {
		t.Fatal(err)
	}
	LogSeedOnFailure(t, seed)
	t.Cleanup(n.Close)
	return n
}

// Cluster is a set of connected channels under test.
type Cluster struct {
	Net      *sim.Network // nil if the stacks are not on SIM
	Channels []*stack.Channel
	Recv     []*Collector
}

// Names are the logical names given to members, in order.
var Names = []string{"A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P"}

func memberName(i int) string {
	if i < len(Names) {
		return Names[i]
	}
	return fmt.Sprintf("M%d", i)
}

// StartSIM starts n channels on a fresh SIM network. above(i) returns the
// protocols to place above SIM for member i (nil for a bare transport).
// Each member gets a Collector as receiver, and all members get one view of
// all of them (injected, as there may be no membership protocol). Channels
// are closed when t ends.
func StartSIM(t testing.TB, n int, seed uint64, above func(i int) []stack.Protocol) *Cluster {
	t.Helper()
	net := NewNetwork(t, seed)
	c := Start(t, n, func(i int) []stack.Protocol {
		cfg := sim.DefaultConfig()
		cfg.Network = net.Name()
		ps := []stack.Protocol{sim.New(cfg)}
		if above != nil {
			ps = append(ps, above(i)...)
		}
		return ps
	})
	c.Net = net
	c.InjectView(t)
	return c
}

// Start builds, names and connects n channels (to cluster "test"); build(i)
// returns member i's protocols, bottom first.
func Start(t testing.TB, n int, build func(i int) []stack.Protocol) *Cluster {
	t.Helper()
	c := &Cluster{}
	for i := range n {
		col := NewCollector()
		ch, err := stack.New(stack.FromProtocols(build(i)...), stack.WithName(memberName(i)), stack.WithReceiver(col))
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		t.Cleanup(func() { _ = ch.Close() })
		if err := ch.Connect(context.Background(), "test"); err != nil {
			t.Fatalf("member %d: connect: %v", i, err)
		}
		c.Channels = append(c.Channels, ch)
		c.Recv = append(c.Recv, col)
	}
	return c
}

// Addresses returns the members' addresses in order.
func (c *Cluster) Addresses() []stack.Address {
	out := make([]stack.Address, len(c.Channels))
	for i, ch := range c.Channels {
		out[i] = ch.Address()
	}
	return out
}

// InjectView installs one view of every member on every member (the first
// member is the coordinator).
func (c *Cluster) InjectView(t testing.TB) *stack.View {
	t.Helper()
	addrs := c.Addresses()
	seq := uint64(2)
	if v := c.Channels[0].View(); v != nil {
		seq = v.ID.Seq + 1
	}
	v := stack.NewView(addrs[0], seq, addrs...)
	InjectView(t, v, c.Channels...)
	return v
}

// InjectView installs v on each of chs.
func InjectView(t testing.TB, v *stack.View, chs ...*stack.Channel) {
	t.Helper()
	for _, ch := range chs {
		if err := stack.Of(ch).InstallView(context.Background(), v); err != nil {
			t.Fatalf("inject view on %s: %v", ch.Address(), err)
		}
	}
}

// Close closes every channel.
func (c *Cluster) Close() {
	for i := len(c.Channels) - 1; i >= 0; i-- {
		_ = c.Channels[i].Close()
	}
}

// Poll is how often WaitFor re-checks its condition (virtual time under
// synctest).
const Poll = time.Millisecond

// WaitFor waits until cond holds, re-checking every Poll, and fails t
// with the formatted message if it does not hold within timeout. Under
// synctest the timeout is virtual.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("condition not met within %s: %s", timeout, fmt.Sprintf(format, args...))
	}
}

// Eventually reports whether cond holds within timeout.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Poll)
	}
}

// WaitForSameView waits until every channel has the same view with all
// of them as members.
func WaitForSameView(t testing.TB, timeout time.Duration, chs ...*stack.Channel) {
	t.Helper()
	WaitFor(t, timeout, func() bool { return SameView(chs...) }, "all %d channels see the same view", len(chs))
}

// SameView reports whether every channel holds the same view, of exactly
// them.
func SameView(chs ...*stack.Channel) bool {
	v0 := chs[0].View()
	if v0 == nil || v0.Size() != len(chs) {
		return false
	}
	for _, ch := range chs {
		v := ch.View()
		if v == nil || v.ID != v0.ID || !v.Contains(ch.Address()) {
			return false
		}
	}
	return true
}

// Payload encodes a sender index and sequence number as an 8-byte payload
// (padded to size), for invariant checks.
func Payload(sender, seq, size int) []byte {
	p := make([]byte, max(size, 8))
	binary.BigEndian.PutUint32(p, uint32(sender))
	binary.BigEndian.PutUint32(p[4:], uint32(seq))
	return p
}

// ParsePayload decodes a payload made by Payload.
func ParsePayload(p []byte) (sender, seq int, ok bool) {
	if len(p) < 8 {
		return 0, 0, false
	}
	return int(binary.BigEndian.Uint32(p)), int(binary.BigEndian.Uint32(p[4:])), true
}

// Collector is a Receiver that records what it gets, for invariant checks.
// Payloads made by Payload are tracked per (source address, sender index).
type Collector struct {
	mu    sync.Mutex
	msgs  []*stack.Message
	views []*stack.View
	seqs  map[stack.Address][]int
	OnMsg func(m *stack.Message) // optional hook, called before recording
}

// NewCollector returns an empty collector.
func NewCollector() *Collector { return &Collector{seqs: map[stack.Address][]int{}} }

// Receive records m.
func (c *Collector) Receive(m *stack.Message) {
	if f := c.OnMsg; f != nil {
		f(m)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, m)
	if _, seq, ok := ParsePayload(m.Payload); ok {
		c.seqs[m.Src] = append(c.seqs[m.Src], seq)
	}
}

// ViewAccepted records v.
func (c *Collector) ViewAccepted(v *stack.View) {
	c.mu.Lock()
	c.views = append(c.views, v)
	c.mu.Unlock()
}

// Len returns the number of messages received.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// Messages returns a copy of the received messages.
func (c *Collector) Messages() []*stack.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*stack.Message(nil), c.msgs...)
}

// Views returns the views received.
func (c *Collector) Views() []*stack.View {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*stack.View(nil), c.views...)
}

// Seqs returns the sequence numbers received from src, in delivery order.
func (c *Collector) Seqs(src stack.Address) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.seqs[src]...)
}

// Reset forgets everything received.
func (c *Collector) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs, c.views = nil, nil
	c.seqs = map[stack.Address][]int{}
}

// CheckExactlyOnce checks that the sequence numbers from each sender are
// exactly 0..n-1, each once (in any order if fifo is false, in order if
// true). It returns a description of the first violation, or "".
func (c *Collector) CheckExactlyOnce(senders []stack.Address, n int, fifo bool) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range senders {
		got := c.seqs[s]
		seen := make([]bool, n)
		for i, q := range got {
			if q < 0 || q >= n {
				return fmt.Sprintf("from %s: unexpected seqno %d", s, q)
			}
			if seen[q] {
				return fmt.Sprintf("from %s: seqno %d delivered twice", s, q)
			}
			seen[q] = true
			if fifo && q != i {
				return fmt.Sprintf("from %s: position %d holds seqno %d (not FIFO)", s, i, q)
			}
		}
		if len(got) != n {
			for q, ok := range seen {
				if !ok {
					return fmt.Sprintf("from %s: %d of %d delivered, first missing seqno %d", s, len(got), n, q)
				}
			}
		}
	}
	return ""
}

// Window bounds the messages a benchmark has in flight, as flow control
// does in a full stack, so a sender cannot outrun its receiver into kernel
// drops. The receiver calls Got for each message; the sender calls Await
// before each send.
type Window struct {
	Size int64
	n    atomic.Int64
	wake chan struct{}
}

// NewWindow returns a window of size messages.
func NewWindow(size int64) *Window { return &Window{Size: size, wake: make(chan struct{}, 1)} }

// Got counts one received message.
func (w *Window) Got() {
	if w.n.Add(1)%64 == 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Received returns the messages counted so far.
func (w *Window) Received() int64 { return w.n.Load() }

// Await blocks while more than Size of sent messages are unreceived.
func (w *Window) Await(sent int64) {
	for sent-w.n.Load() > w.Size {
		select {
		case <-w.wake:
		case <-time.After(10 * time.Millisecond): // lost messages never wake us
		}
	}
}

// AwaitFor is Await for transports that may lose messages: it returns
// false once nothing has arrived for quiet while the window is full (what
// it counts as in flight was lost), so the benchmark can stop and report
// the loss instead of waiting for good.
func (w *Window) AwaitFor(sent int64, quiet time.Duration) bool {
	last, since := w.n.Load(), time.Now()
	for sent-w.n.Load() > w.Size {
		if n := w.n.Load(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= quiet {
			return false
		}
		select {
		case <-w.wake:
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}

// Settle waits until Received reaches want or stops growing for quiet, and
// returns it (for benchmarks over lossy transports).
func (w *Window) Settle(want int64, quiet time.Duration) int64 {
	last, since := w.Received(), time.Now()
	for last < want && time.Since(since) < quiet {
		time.Sleep(time.Millisecond)
		if n := w.Received(); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}

// WindowReceiver counts messages into a Window.
type WindowReceiver struct{ W *Window }

// Receive counts m.
func (r WindowReceiver) Receive(*stack.Message) { r.W.Got() }

// ViewAccepted does nothing.
func (r WindowReceiver) ViewAccepted(*stack.View) {}

// Stat returns the counter name of p; it fails t if p has no such counter.
func Stat(t testing.TB, p stack.StatsReporter, name string) int64 {
	t.Helper()
	for _, s := range p.Stats() {
		if s.Name == name {
			return s.Value
		}
	}
	t.Fatalf("%T has no statistic %q", p, name)
	return 0
}

// CheckHeaderSizes checks every registered header's samples: Size must equal
// the encoded length, and decoding must give the header back.
func CheckHeaderSizes(t *testing.T) {
	for id, name := range stack.HeaderIDs() {
		t.Run(name, func(t *testing.T) {
			for i, h := range stack.HeaderSamples(id) {
				enc := h.AppendTo(nil)
				if h.Size() != len(enc) {
					t.Errorf("sample %d (%v): Size() %d, encoded %d bytes", i, h, h.Size(), len(enc))
				}
				dec, err := stack.DecodeHeader(id, enc)
				if err != nil {
					t.Errorf("sample %d (%v): %v", i, h, err)
				} else if !reflect.DeepEqual(dec, h) {
					t.Errorf("sample %d: round trip gives %#v, want %#v", i, dec, h)
				}
			}
		})
	}
}

// EventRecorder is a layer that records every event passing up through it
// and passes it on, so a test can watch what a protocol below tells the
// layers above (suspicions, merges).
type EventRecorder struct {
	stack.Base
	mu  sync.Mutex
	evs []stack.Event
}

// NewEventRecorder returns an empty recorder.
func NewEventRecorder() *EventRecorder { return &EventRecorder{} }

// Name returns "EVENTS".
func (r *EventRecorder) Name() string { return "EVENTS" }

// UpEvent records ev and passes it up.
func (r *EventRecorder) UpEvent(ev stack.Event) (stack.Answer, error) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
	return r.PassUpEvent(ev)
}

// Events returns the recorded events, oldest first.
func (r *EventRecorder) Events() []stack.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// Recorded returns the events of type E that r recorded, oldest first.
func Recorded[E stack.Event](r *EventRecorder) []E {
	var out []E
	for _, ev := range r.Events() {
		if e, ok := ev.(E); ok {
			out = append(out, e)
		}
	}
	return out
}

// Suspected returns every address of the recorded EvSuspect events.
func (r *EventRecorder) Suspected() []stack.Address {
	var out []stack.Address
	for _, ev := range Recorded[stack.EvSuspect](r) {
		out = append(out, ev.Members...)
	}
	return out
}

// LogStatsOnFailure logs, if t fails, each channel's view and the non-zero
// counters of its layers: what a test on real sockets, which cannot be
// replayed, leaves to diagnose it by.
func LogStatsOnFailure(t testing.TB, chs ...*stack.Channel) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, ch := range chs {
			var b strings.Builder
			fmt.Fprintf(&b, "%s view %v:", ch.Name(), ch.View())
			for _, ps := range ch.Stats() {
				fmt.Fprintf(&b, "\n  %s:", ps.Protocol)
				for _, s := range ps.Stats {
					if s.Value != 0 {
						fmt.Fprintf(&b, " %s=%d", s.Name, s.Value)
					}
				}
			}
			t.Log(b.String())
		}
	})
}
