package statetransfer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/grouptest"
	"github.com/strata-go/strata/protocols/flush"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/statetransfer"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// stream is a reproducible state of n bytes: a counter-mode generator, so
// neither side ever holds the whole state.
type stream struct {
	n, off int64
	block  [32]byte
	pos    int
}

func (s *stream) next() {
	var ctr [8]byte
	for i := range ctr {
		ctr[i] = byte(s.off >> (8 * i))
	}
	s.block = sha256.Sum256(ctr[:])
	s.pos = 0
}

func (s *stream) Read(p []byte) (int, error) {
	if s.off >= s.n {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && s.off < s.n {
		if s.off%32 == 0 {
			s.next()
		}
		c := copy(p[n:], s.block[s.pos:min(32, s.pos+int(s.n-s.off))])
		s.pos += c
		s.off += int64(c)
		n += c
	}
	return n, nil
}

func sum(r io.Reader) ([]byte, error) {
	h := sha256.New()
	_, err := io.Copy(h, r)
	return h.Sum(nil), err
}

// handler provides a state from gen and checks what it is given against
// want; OnRead runs after every read (the memory sampler).
type handler struct {
	*stacktest.Collector
	gen    func() io.Reader
	mu     sync.Mutex
	got    []byte
	onRead func()
}

func (h *handler) GetState(w io.Writer) error {
	_, err := io.Copy(w, h.gen())
	return err
}

func (h *handler) SetState(r io.Reader) error {
	d := sha256.New()
	var rd io.Reader = r
	if h.onRead != nil {
		rd = &sampling{r: r, f: h.onRead}
	}
	_, err := io.Copy(d, rd)
	h.mu.Lock()
	h.got = d.Sum(nil)
	h.mu.Unlock()
	return err
}

type sampling struct {
	r     io.Reader
	f     func()
	bytes int
}

func (s *sampling) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.bytes += n
	if s.bytes >= 4<<20 {
		s.bytes = 0
		s.f()
	}
	return n, err
}

func newLab(t *testing.T, seed uint64, hs []*handler) *grouptest.Lab {
	l := grouptest.New(t, seed)
	l.Top = func(int) []stack.Protocol {
		return []stack.Protocol{statetransfer.New(statetransfer.DefaultConfig()), flush.New(flush.DefaultConfig())}
	}
	l.Receiver = func(i int, col *stacktest.Collector) stack.Receiver {
		hs[i].Collector = col
		return hs[i]
	}
	return l
}

// start connects n members and returns them in the order they were added
// (so member i has handler i).
func start(t *testing.T, l *grouptest.Lab, n int) []*grouptest.Member {
	ms := make([]*grouptest.Member, n)
	for i := range ms {
		ms[i] = l.Add()
	}
	l.ConnectAll(ms...)
	stacktest.WaitFor(t, time.Minute, func() bool { return grouptest.SameView(ms...) }, "one view")
	return ms
}

// TestLargeStateIsStreamed transfers a 200 MB state inside a flush and
// measures the requester's heap while it reads: it grows by a small part
// of the state, because the provider writes only as fast as the requester
// reads (a window of chunks).
func TestLargeStateIsStreamed(t *testing.T) {
	const size = 200 << 20
	if testing.Short() {
		t.Skip("streams 200 MB")
	}
	synctest.Test(t, func(t *testing.T) {
		want, err := sum(&stream{n: size})
		require.NoError(t, err)
		var base, peak uint64
		sample := func() {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
		hs := []*handler{
			{gen: func() io.Reader { return &stream{n: size} }},
			{gen: func() io.Reader { return bytes.NewReader(nil) }, onRead: sample},
		}
		l := newLab(t, 1, hs)
		ms := start(t, l, 2)
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		base = m0.HeapInuse
		require.NoError(t, ms[1].Ch.GetState(t.Context(), ms[0].Addr()))
		require.Equal(t, want, hs[1].got, "the requester read exactly the provider's state")
		growth := int64(peak) - int64(base)
		t.Logf("state %d MB; requester heap in use: %.1f MB before, peak %.1f MB while reading (growth %.1f MB)",
			size>>20, float64(base)/(1<<20), float64(peak)/(1<<20), float64(growth)/(1<<20))
		require.Less(t, growth, int64(size/4), "the state is streamed, never held whole")
		require.EqualValues(t, size, stacktest.Stat(t, ms[1].Top[0].(*statetransfer.StateTransfer), "bytes_received"))
	})
}

// TestStateTransferUnderLoss: a 4 MB state arrives intact over 10% loss,
// for every seed.
func TestStateTransferUnderLoss(t *testing.T) {
	const size = 4 << 20
	want, err := sum(&stream{n: size})
	require.NoError(t, err)
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		hs := []*handler{
			{gen: func() io.Reader { return &stream{n: size} }},
			{gen: func() io.Reader { return bytes.NewReader(nil) }},
			{gen: func() io.Reader { return bytes.NewReader(nil) }},
		}
		l := newLab(t, seed, hs)
		ms := start(t, l, 3)
		l.Net.SetDefault(sim.Rule{Drop: 0.1})
		require.NoError(t, ms[2].Ch.GetState(t.Context(), ms[0].Addr()))
		require.Equal(t, want, hs[2].got)
	})
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// TestProviderErrorReachesTheRequester: the provider's GetState fails half
// way; the requester's GetState returns the provider's error and the group
// is unblocked.
func TestProviderErrorReachesTheRequester(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		hs := []*handler{
			{gen: func() io.Reader { return io.MultiReader(&stream{n: 100_000}, failing{}) }},
			{gen: func() io.Reader { return bytes.NewReader(nil) }},
		}
		l := newLab(t, seed, hs)
		ms := start(t, l, 2)
		err := ms[1].Ch.GetState(t.Context(), ms[0].Addr())
		require.ErrorContains(t, err, "disk on fire")
		require.NoError(t, ms[0].Ch.Send(context.Background(), stack.NewMessage(stack.Address{}, []byte("after"))), "the provider can send again")
		stacktest.WaitFor(t, time.Minute, func() bool { return ms[1].Col.Len() > 0 }, "the multicast after the failed transfer arrives")
	})
}

// ledger is an application whose state is, per sender, the last seqno of
// its multicasts applied. Each message must be the next one of its sender:
// one already in the state and delivered again, one in neither, or one
// delivered before the state arrived, is an error.
type ledger struct {
	*stacktest.Collector
	mu      sync.Mutex
	noState bool // a joiner before SetState
	last    map[int]int
	errs    []string
}

func newLedger(joiner bool) *ledger { return &ledger{noState: joiner, last: map[int]int{}} }

func (l *ledger) Receive(m *stack.Message) {
	var i, seq int
	if _, err := fmt.Sscanf(string(m.Payload), "%d/%d", &i, &seq); err == nil && m.IsMulticast() {
		l.mu.Lock()
		switch want, ok := l.last[i]; {
		case l.noState:
			l.errs = append(l.errs, fmt.Sprintf("%d/%d delivered before the state", i, seq))
		case !ok && seq != 0, ok && seq != want+1:
			l.errs = append(l.errs, fmt.Sprintf("%d/%d delivered after %d/%d", i, seq, i, want))
		}
		l.last[i] = seq
		l.mu.Unlock()
	}
	l.Collector.Receive(m)
}

func (l *ledger) GetState(w io.Writer) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, seq := range l.last {
		if _, err := fmt.Fprintf(w, "%d/%d\n", i, seq); err != nil {
			return err
		}
	}
	return nil
}

func (l *ledger) SetState(r io.Reader) error {
	b, err := io.ReadAll(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		var i, seq int
		if _, err := fmt.Sscanf(string(line), "%d/%d", &i, &seq); err == nil {
			l.last[i] = seq
		}
	}
	l.noState = false
	return err
}

func (l *ledger) snapshot() (map[int]int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.last), slices.Clone(l.errs)
}

// TestConnectWithStateInOneFlush: members multicast all the time while a
// third joins with ConnectWithState. The joiner's state and the messages it
// is delivered afterwards add up to exactly what the others applied: no
// message is in the state and delivered again, none is in neither. The join
// takes one flush round.
func TestConnectWithStateInOneFlush(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		ls := []*ledger{newLedger(false), newLedger(false), newLedger(true)}
		l := grouptest.New(t, seed)
		l.Top = func(int) []stack.Protocol {
			return []stack.Protocol{statetransfer.New(statetransfer.DefaultConfig()), flush.New(flush.DefaultConfig())}
		}
		l.Receiver = func(i int, col *stacktest.Collector) stack.Receiver {
			ls[i].Collector = col
			return ls[i]
		}
		ms := start(t, l, 2)
		l.Net.SetDefault(sim.Rule{Drop: 0.05})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		for i, m := range ms {
			wg.Go(func() {
				for seq := 0; ctx.Err() == nil; seq++ {
					if m.Ch.Send(ctx, stack.NewMessage(stack.Address{}, fmt.Appendf(nil, "%d/%d", i, seq))) != nil {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		time.Sleep(time.Second)
		c := l.Add()
		coord := grouptest.ByView(ms)[0].Top[1].(*flush.FLUSH)
		flushesBefore := stacktest.Stat(t, coord, "flushes_completed")
		require.NoError(t, c.Ch.ConnectWithState(t.Context(), "test", stack.Address{}))
		require.Equal(t, flushesBefore+1, stacktest.Stat(t, coord, "flushes_completed"), "joining with the state took one flush round")
		st, _ := ls[2].snapshot()
		require.NotEmpty(t, st, "the joiner got a state")
		time.Sleep(time.Second)
		cancel()
		wg.Wait()
		stacktest.WaitFor(t, time.Minute, func() bool {
			a, _ := ls[0].snapshot()
			b, _ := ls[1].snapshot()
			j, _ := ls[2].snapshot()
			return maps.Equal(a, b) && maps.Equal(a, j)
		}, "every member applied the same messages")
		for i, lg := range ls {
			_, errs := lg.snapshot()
			require.Empty(t, errs, "member %d applied every message once, in order, after its state", i)
		}
	})
}

// slowApplier is an application whose state is the list of multicasts it
// has applied; with slow, applying one takes a second.
type slowApplier struct {
	*stacktest.Collector
	slow     bool
	applying atomic.Bool
	mu       sync.Mutex
	applied  []string
	got      string
}

func (a *slowApplier) Receive(m *stack.Message) {
	if a.slow {
		a.applying.Store(true)
		time.Sleep(time.Second)
	}
	a.mu.Lock()
	a.applied = append(a.applied, string(m.Payload))
	a.mu.Unlock()
	a.Collector.Receive(m)
}

func (a *slowApplier) GetState(w io.Writer) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err := fmt.Fprint(w, strings.Join(a.applied, ","))
	return err
}

func (a *slowApplier) SetState(r io.Reader) error {
	b, err := io.ReadAll(r)
	a.mu.Lock()
	a.got = string(b)
	a.mu.Unlock()
	return err
}

// TestStateCoversAMessageStillInReceive: the provider is still applying a
// multicast (its Receive takes a second) when another member asks for its
// state. The flush before the transfer does not wait for the application
// (only for the message to reach the channel), so the provider's GetState
// must: the state includes the message, which the requester's digest
// counts as delivered.
func TestStateCoversAMessageStillInReceive(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		as := []*slowApplier{{}, {slow: true}, {}}
		l := grouptest.New(t, seed)
		l.Top = func(int) []stack.Protocol {
			return []stack.Protocol{statetransfer.New(statetransfer.DefaultConfig()), flush.New(flush.DefaultConfig())}
		}
		l.Receiver = func(i int, col *stacktest.Collector) stack.Receiver {
			as[i].Collector = col
			return as[i]
		}
		ms := start(t, l, 3)
		require.NoError(t, ms[0].Ch.Send(t.Context(), stack.NewMessage(stack.Address{}, []byte("slow"))))
		stacktest.WaitFor(t, time.Minute, as[1].applying.Load, "B is applying it")
		require.NoError(t, ms[2].Ch.GetState(t.Context(), ms[1].Addr()))
		as[2].mu.Lock()
		defer as[2].mu.Unlock()
		require.Equal(t, "slow", as[2].got, "B's state includes the message B was applying when asked")
	})
}
