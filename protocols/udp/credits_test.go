package udp_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/mfc"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestTwoMembersGetTheWholeMulticastBufferWhenOwnMulticastsAreFiltered:
// over UDP, a member's own multicasts reach its multicast socket's buffer
// only when no filter drops them first. With the filter, the one other
// member of two is the only sender into a member's buffer, so MFC gives it
// the whole buffer as credits; without it, the member's own multicasts
// share the buffer and each gets half.
func TestTwoMembersGetTheWholeMulticastBufferWhenOwnMulticastsAreFiltered(t *testing.T) {
	for _, filtered := range []bool{true, false} {
		t.Run(fmt.Sprintf("filtered=%v", filtered), func(t *testing.T) {
			cfg := testConfig(t)
			fcfg := mfc.DefaultConfig()
			fcfg.MaxCredits = 64 << 20 // above any buffer: the share decides
			var ms []*member
			var fcs []*mfc.MFC
			for i := range 2 {
				u := udp.New(cfg)
				if !filtered {
					u = udp.WithoutOwnFilter(u)
				}
				fc := mfc.New(fcfg)
				col := stacktest.NewCollector()
				ch, err := stack.New(stack.FromProtocols(u, nakack.New(nakack.DefaultConfig()), fc),
					stack.WithName(fmt.Sprintf("credits-%c", 'A'+i)), stack.WithReceiver(col))
				require.NoError(t, err)
				t.Cleanup(func() { _ = ch.Close() })
				require.NoError(t, ch.Connect(context.Background(), "credits"))
				ms, fcs = append(ms, &member{ch: ch, udp: u, col: col}), append(fcs, fc)
			}
			introduce(t, ms)
			a, b := ms[0].ch.Address(), ms[1].ch.Address()
			stacktest.InjectView(t, stack.NewView(a, 2, a, b), ms[0].ch, ms[1].ch)

			u := ms[0].udp
			if filtered && u.ReceivesOwnMulticasts() {
				t.Skip("no socket filter on this system")
			}
			require.Equal(t, !filtered, u.ReceivesOwnMulticasts())
			buf := int64(u.ReceiveBuffer(true))
			require.Positive(t, buf)
			want := buf
			if !filtered {
				want = buf / 2
			}
			require.Equal(t, map[stack.Address]int64{b: want}, fcs[0].Credits())
		})
	}
}
