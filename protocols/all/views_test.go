package all_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// viewSpy records the views that pass it, and in which direction.
type viewSpy struct {
	stack.Base
	name string
	mu   sync.Mutex
	down map[stack.ViewID]int
	up   map[stack.ViewID]int
}

func newViewSpy(name string) *viewSpy {
	return &viewSpy{name: name, down: map[stack.ViewID]int{}, up: map[stack.ViewID]int{}}
}

func (s *viewSpy) Name() string { return s.name }

// seen returns copies of what passed down and up.
func (s *viewSpy) seen() (down, up map[stack.ViewID]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.down), maps.Clone(s.up)
}

func (s *viewSpy) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok && vc.View != nil {
		v := vc.View
		s.mu.Lock()
		s.down[v.ID]++
		s.mu.Unlock()
	}
	return s.PassDownEvent(ctx, ev)
}

func (s *viewSpy) UpEvent(ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok && vc.View != nil {
		v := vc.View
		s.mu.Lock()
		s.up[v.ID]++
		s.mu.Unlock()
	}
	return s.PassUpEvent(ev)
}

// TestEachLayerSeesEachViewOnce: GMS passes a view down to the layers below
// it and up through the layers above it; no layer sees a view twice (they
// did: GMS sent it down from the top of the stack, then up). Three members
// of flush.toml join one after the other.
func TestEachLayerSeesEachViewOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := stacktest.NewNetwork(t, 1)
		data := simStack(t, "flush.toml", "")
		vars := map[string]string{"STRATA_SIM_NETWORK": net.Name()}
		var chs []*stack.Channel
		type spies struct{ below, above, top *viewSpy }
		var all []spies
		for i := range 3 {
			sc, err := stack.ParseConfigVars("flush.toml", data, vars)
			require.NoError(t, err)
			ch, err := stack.New(stack.FromConfig(sc), stack.WithName(stacktest.Names[i]))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ch.Close() })
			sp := spies{newViewSpy("SPY_BELOW"), newViewSpy("SPY_ABOVE"), newViewSpy("SPY_TOP")}
			require.NoError(t, stack.Of(ch).InsertBelow(sp.below, "GMS"))
			require.NoError(t, stack.Of(ch).InsertAbove(sp.above, "GMS"))
			require.NoError(t, stack.Of(ch).InsertAbove(sp.top, "FLUSH"))
			require.NoError(t, ch.Connect(t.Context(), "views"))
			chs, all = append(chs, ch), append(all, sp)
		}
		stacktest.WaitForSameView(t, time.Minute, chs...)
		for i, sp := range all {
			for _, s := range []*viewSpy{sp.below, sp.above, sp.top} {
				down, up := s.seen()
				for id, n := range down {
					require.Equal(t, 1, n, "%s of %s saw view %s going down %d times", s.name, stacktest.Names[i], id, n)
				}
				for id, n := range up {
					require.Equal(t, 1, n, "%s of %s saw view %s going up %d times", s.name, stacktest.Names[i], id, n)
					require.Zero(t, down[id], "%s of %s saw view %s in both directions", s.name, stacktest.Names[i], id)
				}
				require.Equal(t, chs[i].View().ID, s.View().ID, "Base.View of %s at %s is the channel's view", s.name, stacktest.Names[i])
				if s == sp.below {
					require.NotEmpty(t, down, "below GMS the views go down")
					require.Empty(t, up)
				} else {
					require.NotEmpty(t, up, "above GMS the views go up")
					require.Empty(t, down)
				}
			}
		}
		// A member that disconnects forgets the view in every layer, those
		// below GMS once it has left (MERGE3 and PING then stop announcing
		// it as a member).
		require.NoError(t, chs[2].Disconnect(t.Context()))
		for _, s := range []*viewSpy{all[2].below, all[2].above, all[2].top} {
			require.Nil(t, s.View(), "Base.View of %s after Disconnect", s.name)
		}
		for _, p := range stack.Of(chs[2]).Protocols() {
			if b, ok := p.(interface{ View() *stack.View }); ok {
				require.Nil(t, b.View(), "%s's view after Disconnect", p.Name())
			}
		}
	})
}
