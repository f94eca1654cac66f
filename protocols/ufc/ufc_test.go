package ufc_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/flowcontrol"
	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/ufc"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func testConfig() ufc.Config {
	cfg := ufc.DefaultConfig()
	cfg.MaxCredits = 10_000
	cfg.MinThreshold = 0.4
	cfg.MaxBlockTime = 500 * time.Millisecond
	return cfg
}

type member struct {
	ch  *stack.Channel
	fc  *ufc.UFC
	d   *discard.Discard
	col *stacktest.Collector
}

// start builds n members of SIM | UNICAST2 | DISCARD | UFC with one view.
func start(t *testing.T, n int, cfg ufc.Config) []member {
	ms := make([]member, n)
	c := stacktest.StartSIM(t, n, 1, func(i int) []stack.Protocol {
		ms[i].fc = ufc.New(cfg)
		ms[i].d = discard.New(discard.DefaultConfig())
		return []stack.Protocol{unicast2.New(unicast2.DefaultConfig()), ms[i].d, ms[i].fc}
	})
	for i := range ms {
		ms[i].ch, ms[i].col = c.Channels[i], c.Recv[i]
	}
	return ms
}

func send(ctx context.Context, from, to member, seq int) error {
	return from.ch.Send(ctx, stack.NewMessage(to.ch.Address(), stacktest.Payload(0, seq, 1000)))
}

// TestSenderWaitsForCreditsAndGoesOnWhenTheReceiverCatchesUp: B's Receive
// is stuck, so A can send max_credits bytes and then blocks (honouring its
// context); once B's application goes on, B returns credits and A's sends
// complete, all delivered once and in order.
func TestSenderWaitsForCreditsAndGoesOnWhenTheReceiverCatchesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := start(t, 2, testConfig())
		a, b := ms[0], ms[1]
		release := make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		defer open()
		b.col.OnMsg = func(*stack.Message) { <-release }
		for seq := range 10 { // 10 x 1000 bytes: every credit
			require.NoError(t, send(t.Context(), a, b, seq))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := send(ctx, a, b, 10)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the 11th message waits for credits")
		require.Positive(t, stacktest.Stat(t, a.fc, "blockings"))

		done := make(chan error, 1)
		go func() {
			var err error
			for seq := 10; seq < 40 && err == nil; seq++ {
				err = send(t.Context(), a, b, seq)
			}
			done <- err
		}()
		open()
		select {
		case err := <-done:
			require.NoError(t, err, "B's credits let A go on")
		case <-time.After(time.Minute):
			t.Fatal("A is still blocked: B's credits let A go on")
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return b.col.Len() == 40 }, "B delivered all 40")
		require.Empty(t, b.col.CheckExactlyOnce([]stack.Address{a.ch.Address()}, 40, true))
		require.Positive(t, stacktest.Stat(t, b.fc, "credits_sent"))
	})
}

// TestControlTrafficPassesWithoutCredits: with every credit spent and the
// receiver stuck, INTERNAL and NO_FC messages still go out at once.
func TestControlTrafficPassesWithoutCredits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := start(t, 2, testConfig())
		a, b := ms[0], ms[1]
		release := make(chan struct{})
		defer close(release)
		var nofc atomic.Int32
		b.col.OnMsg = func(m *stack.Message) {
			if m.Flags&stack.NoFC != 0 {
				nofc.Add(1)
				return
			}
			<-release
		}
		for seq := range 10 {
			require.NoError(t, send(t.Context(), a, b, seq))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		for range 5 {
			m := stack.NewMessage(b.ch.Address(), make([]byte, 1000)).Set(stack.NoFC | stack.OOB)
			require.NoError(t, a.ch.Send(ctx, m), "NO_FC does not wait")
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return nofc.Load() == 5 }, "B got the NO_FC messages")
		require.Zero(t, stacktest.Stat(t, a.fc, "blockings"))
	})
}

// TestLostCreditsAreAskedFor: B's first two CREDITs are lost (as with a
// connection that was reset), so A's credits shrink below what B returns
// at a time and A runs out for good. After max_block_time A asks B
// (CREDIT_REQUEST); B, which holds nothing of A's, grants what A asked for,
// and A goes on.
func TestLostCreditsAreAskedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		ms := start(t, 2, cfg)
		a, b := ms[0], ms[1]
		var lost atomic.Int32
		b.d.DropDownIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDUFC).(*flowcontrol.Header)
			return ok && h.Type == flowcontrol.TypeCredit && lost.Add(1) <= 2
		})
		start := time.Now()
		for seq := range 30 {
			require.NoError(t, send(t.Context(), a, b, seq))
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return b.col.Len() == 30 }, "B delivered all 30")
		require.Positive(t, stacktest.Stat(t, a.fc, "credit_requests_sent"))
		require.Positive(t, stacktest.Stat(t, b.fc, "credits_granted_on_request"))
		require.Less(t, time.Since(start), 3*cfg.MaxBlockTime, "asked after max_block_time (virtual time)")
	})
}

// TestRequestsAnsweredFromReceiveDoNotDeadlock: A and B each send 200
// requests of 1000 bytes to the other and answer every request from inside
// Receive with 1000 bytes. With credits for 10 messages, both Receives end
// up waiting for credits that only the other's Receive would return
// (JGroups' JGRP-465). The wait is broken by CREDIT_REQUEST: a receiver
// whose delivery from the asker has not moved for max_block_time while a
// sender of its own waits for credits grants them. Every request is
// answered.
func TestRequestsAnsweredFromReceiveDoNotDeadlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := start(t, 2, testConfig())
		const n = 200
		var replies [2]atomic.Int32
		msg := func(to member, kind byte) *stack.Message {
			p := make([]byte, 1000)
			p[0] = kind
			return stack.NewMessage(to.ch.Address(), p)
		}
		// Both send all their credits' worth before either Receive
		// answers, so both answers wait for credits.
		var filled sync.WaitGroup
		filled.Add(2)
		barrier := make(chan struct{})
		go func() { filled.Wait(); close(barrier) }()
		for i := range ms {
			me, peer := ms[i], ms[1-i]
			me.col.OnMsg = func(m *stack.Message) {
				if m.Payload[0] == 'R' {
					replies[i].Add(1)
					return
				}
				<-barrier
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := me.ch.Send(ctx, msg(peer, 'R')); err != nil {
					t.Errorf("reply: %v", err)
				}
			}
		}
		var wg sync.WaitGroup
		for i := range ms {
			wg.Go(func() {
				for k := range n {
					if k == 10 {
						filled.Done()
					}
					if err := ms[i].ch.Send(t.Context(), msg(ms[1-i], 'Q')); err != nil {
						t.Errorf("request: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		stacktest.WaitFor(t, 5*time.Minute, func() bool { return replies[0].Load() == n && replies[1].Load() == n }, "every request answered")
		require.Positive(t, stacktest.Stat(t, ms[0].fc, "credits_granted_on_request")+stacktest.Stat(t, ms[1].fc, "credits_granted_on_request"))
	})
}

// TestStallOverTheThresholdIsLoggedOnceAndCounted: a sender blocked past
// stall_threshold logs one Warn naming the member whose credits it waits
// for, and counts one stall, however long it stays blocked.
func TestStallOverTheThresholdIsLoggedOnceAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.StallTime = 2 * time.Second
		ms := start(t, 2, cfg)
		a, b := ms[0], ms[1]
		var logs logBuffer
		stack.Of(a.ch).SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
		release := make(chan struct{})
		defer close(release)
		b.col.OnMsg = func(*stack.Message) { <-release }
		for seq := range 10 {
			require.NoError(t, send(t.Context(), a, b, seq))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		require.ErrorIs(t, send(ctx, a, b, 10), context.DeadlineExceeded)
		cancel()
		require.EqualValues(t, 1, stacktest.Stat(t, a.fc, "stalls"))
		lines := logs.Lines("flow control: a sender is stalled")
		require.Len(t, lines, 1)
		require.Contains(t, lines[0], "level=WARN")
		require.Contains(t, lines[0], "protocol=UFC")
		require.Contains(t, lines[0], "members=["+b.ch.Address().String()+"]")
		require.Contains(t, lines[0], "view=")
	})
}

// logBuffer keeps log lines for a test to read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Lines returns the lines that contain s.
func (l *logBuffer) Lines(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// unicastBuffer stands in for a transport whose unicast receive buffer is
// bounded: it reports 300,000 bytes for unicasts and 0 (not known) for
// group messages. Its own multicasts reach its buffer, which must not
// change UFC's share: a member's unicasts to itself never do.
type unicastBuffer struct{ stack.Base }

func (*unicastBuffer) ReceivesOwnMulticasts() bool { return true }

func (*unicastBuffer) Name() string { return "UBUFFER" }

func (*unicastBuffer) ReceiveBuffer(group bool) int {
	if group {
		return 0
	}
	return 300_000
}

var (
	_ stack.ReceiveBufferSizer   = (*unicastBuffer)(nil)
	_ stack.OwnMulticastReceiver = (*unicastBuffer)(nil)
)

// TestUnicastCreditsFitTheUnicastReceiveBuffer: UFC takes its share of the
// buffer that takes unicasts (300,000 bytes among the 2 other members of 3:
// a member's unicasts to itself never reach its socket), not of the one
// for group messages.
func TestUnicastCreditsFitTheUnicastReceiveBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := ufc.DefaultConfig()
		fcs := make([]*ufc.UFC, 3)
		stacktest.StartSIM(t, 3, 1, func(i int) []stack.Protocol {
			fcs[i] = ufc.New(cfg)
			return []stack.Protocol{&unicastBuffer{}, unicast2.New(unicast2.DefaultConfig()), fcs[i]}
		})
		require.Len(t, fcs[0].Credits(), 2)
		for _, c := range fcs[0].Credits() {
			require.Equal(t, int64(150_000), c)
		}
	})
}
