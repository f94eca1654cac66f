package mfc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/mfc"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestMulticastWaitsForTheSlowestMemberUntilItLeaves: C's Receive is stuck,
// so A's multicasts stop once C's credits are spent, although B keeps up.
// When a view without C comes, what C held is released and A goes on;
// every multicast reaches B once and in order.
func TestMulticastWaitsForTheSlowestMemberUntilItLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := mfc.DefaultConfig()
		cfg.MaxCredits = 10_000
		cfg.MaxBlockTime = 500 * time.Millisecond
		fcs := make([]*mfc.MFC, 3)
		c := stacktest.StartSIM(t, 3, 1, func(i int) []stack.Protocol {
			fcs[i] = mfc.New(cfg)
			return []stack.Protocol{nakack.New(nakack.DefaultConfig()), unicast2.New(unicast2.DefaultConfig()), fcs[i]}
		})
		a, b, slow := c.Channels[0], c.Channels[1], c.Channels[2]
		release := make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		defer open()
		c.Recv[2].OnMsg = func(m *stack.Message) {
			if m.Src == a.Address() {
				<-release
			}
		}
		send := func(ctx context.Context, seq int) error {
			return a.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(0, seq, 1000)))
		}
		for seq := range 10 {
			require.NoError(t, send(t.Context(), seq))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		err := send(ctx, 10)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the 11th multicast waits for C's credits")
		require.Equal(t, int64(0), fcs[0].Credits()[slow.Address()])
		require.Positive(t, fcs[0].Credits()[b.Address()], "B returned its credits")

		done := make(chan error, 1)
		go func() {
			var err error
			for seq := 10; seq < 40 && err == nil; seq++ {
				err = send(t.Context(), seq)
			}
			done <- err
		}()
		synctest.Wait()
		stacktest.InjectView(t, stack.NewView(a.Address(), 3, a.Address(), b.Address()), a, b)
		select {
		case err := <-done:
			require.NoError(t, err, "a view without C released A")
		case <-time.After(time.Minute):
			t.Fatal("A is still blocked: a view without C released A")
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return len(c.Recv[1].Seqs(a.Address())) == 40 }, "B delivered all 40")
		require.Empty(t, c.Recv[1].CheckExactlyOnce([]stack.Address{a.Address()}, 40, true))
	})
}

// TestCreditsAreSpentAtEveryMemberExactly checks the accounting of the
// per-message fast path (credits spent without walking the members): C
// processes nothing, B returns what it processed at min_threshold, and
// Credits reports each member's exact balance in between.
func TestCreditsAreSpentAtEveryMemberExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := mfc.DefaultConfig()
		cfg.MaxCredits = 10_000
		cfg.MinThreshold = 0.4
		cfg.MaxBlockTime = time.Minute
		fcs := make([]*mfc.MFC, 3)
		c := stacktest.StartSIM(t, 3, 1, func(i int) []stack.Protocol {
			fcs[i] = mfc.New(cfg)
			return []stack.Protocol{nakack.New(nakack.DefaultConfig()), unicast2.New(unicast2.DefaultConfig()), fcs[i]}
		})
		a, b, slow := c.Channels[0], c.Channels[1], c.Channels[2]
		release := make(chan struct{})
		defer close(release)
		c.Recv[2].OnMsg = func(m *stack.Message) {
			if m.Src == a.Address() {
				<-release
			}
		}
		for seq := range 5 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, make([]byte, 1000))))
			synctest.Wait()
			spent := int64(1000 * (seq + 1))
			returned := spent / 4000 * 4000 // B returns credits per 4000 bytes processed
			require.Equal(t, 10_000-spent+returned, fcs[0].Credits()[b.Address()], "B after %d multicasts", seq+1)
			require.Equal(t, 10_000-spent, fcs[0].Credits()[slow.Address()], "C after %d multicasts", seq+1)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		for range 5 {
			require.NoError(t, a.Send(ctx, stack.NewMessage(stack.Address{}, make([]byte, 1000))))
		}
		err := a.Send(ctx, stack.NewMessage(stack.Address{}, make([]byte, 1)))
		require.ErrorIs(t, err, context.DeadlineExceeded, "C's credits are spent to the byte")
		require.Equal(t, int64(0), fcs[0].Credits()[slow.Address()])
	})
}

// bufferLayer stands in for a transport whose receive buffer is bounded
// (UDP's socket): it reports rcvbuf bytes to flow control, and whether the
// member's own multicasts come back into it (own).
type bufferLayer struct {
	stack.Base
	rcvbuf int
	own    bool
}

func (*bufferLayer) Name() string                  { return "BUFFER" }
func (l *bufferLayer) ReceiveBuffer(bool) int      { return l.rcvbuf }
func (l *bufferLayer) ReceivesOwnMulticasts() bool { return l.own }
func (*bufferLayer) String() string                { return "BUFFER" }

var (
	_ stack.ReceiveBufferSizer   = (*bufferLayer)(nil)
	_ stack.OwnMulticastReceiver = (*bufferLayer)(nil)
)

// TestCreditsFitTheReceiveBuffer: with a receive buffer of 400,000 bytes
// and 4 members, each sender gets its share of it per receiver, not
// max_credits: the buffer divided by the 3 others that may send into it at
// once (133,333), or by all 4 when a member's own multicasts come back
// into its buffer too (100,000). A view of 2 members gives each the whole
// buffer (one other sender), or half with its own multicasts, and what is
// outstanding still counts. With fit_receive_buffer off, max_credits
// stands.
func TestCreditsFitTheReceiveBuffer(t *testing.T) {
	for _, tc := range []struct {
		fit, own  bool
		four, two int64
	}{
		{fit: true, four: 133_333, two: 400_000},
		{fit: true, own: true, four: 100_000, two: 200_000},
		{fit: false, four: 4_000_000, two: 4_000_000},
	} {
		t.Run(fmt.Sprintf("fit=%v,own=%v", tc.fit, tc.own), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := mfc.DefaultConfig()
				cfg.MaxCredits = 4_000_000
				cfg.MaxBlockTime = time.Minute
				cfg.FitBuffer = tc.fit
				fcs := make([]*mfc.MFC, 4)
				c := stacktest.StartSIM(t, 4, 1, func(i int) []stack.Protocol {
					fcs[i] = mfc.New(cfg)
					return []stack.Protocol{&bufferLayer{rcvbuf: 400_000, own: tc.own}, nakack.New(nakack.DefaultConfig()), unicast2.New(unicast2.DefaultConfig()), fcs[i]}
				})
				a, b := c.Channels[0], c.Channels[1]
				share := tc.four
				for _, cr := range fcs[0].Credits() {
					require.Equal(t, share, cr)
				}
				release := make(chan struct{})
				defer close(release)
				c.Recv[1].OnMsg = func(m *stack.Message) {
					if m.Src == a.Address() {
						<-release
					}
				}
				require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, make([]byte, 1000))))
				synctest.Wait()
				require.Equal(t, share-1000, fcs[0].Credits()[b.Address()], "B holds 1000 bytes")
				stacktest.InjectView(t, stack.NewView(a.Address(), 5, a.Address(), b.Address()), a, b)
				share = tc.two
				require.Equal(t, map[stack.Address]int64{b.Address(): share - 1000}, fcs[0].Credits(), "B's share grew, and it still holds 1000 bytes")
			})
		})
	}
}

// TestReceiversAccountOnlyForMembersThatSend: in a group of 12 where one
// member multicasts, every receiver keeps an account for that one sender,
// not for each member of the view (in a large group an account per
// member per member is N² state for senders that never send).
func TestReceiversAccountOnlyForMembersThatSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fcs := make([]*mfc.MFC, 12)
		c := stacktest.StartSIM(t, 12, 1, func(i int) []stack.Protocol {
			fcs[i] = mfc.New(mfc.DefaultConfig())
			return []stack.Protocol{nakack.New(nakack.DefaultConfig()), unicast2.New(unicast2.DefaultConfig()), fcs[i]}
		})
		for seq := range 5 {
			require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, seq, 1000))))
		}
		for i, fc := range fcs[1:] {
			stacktest.WaitFor(t, time.Minute, func() bool { return stat(fc, "senders_accounted") == 1 }, "member %d accounts for the one sender", i+1)
		}
		require.Zero(t, stat(fcs[0], "senders_accounted"), "the sender received nothing controlled")
		require.Len(t, fcs[0].Credits(), 11, "the sender holds credits for every receiver")
	})
}

func stat(fc *mfc.MFC, name string) int64 {
	for _, s := range fc.Stats() {
		if s.Name == name {
			return s.Value
		}
	}
	return -1
}
