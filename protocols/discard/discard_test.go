package discard_test

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func received(t *testing.T, cfg discard.Config, n int) ([]int, *discard.Discard) {
	var got []int
	var d *discard.Discard
	synctest.Test(t, func(t *testing.T) {
		d = discard.New(cfg)
		c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			if i == 1 {
				return []stack.Protocol{d}
			}
			return nil
		})
		a, b := c.Channels[0], c.Channels[1]
		for i := range n {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), stacktest.Payload(0, i, 8))))
		}
		synctest.Wait()
		got = c.Recv[1].Seqs(a.Address())
	})
	return got, d
}

func TestDiscardRateIsSeededAndCounted(t *testing.T) {
	cfg := discard.DefaultConfig()
	cfg.Up, cfg.Seed = 0.5, 9
	g1, d1 := received(t, cfg, 400)
	g2, _ := received(t, cfg, 400)
	require.Equal(t, g1, g2, "same seed drops the same messages")
	up, down := d1.Dropped()
	require.EqualValues(t, 400-len(g1), up, "every drop is counted")
	require.Zero(t, down)
	require.InDelta(t, 200, len(g1), 40)
	cfg.Seed = 10
	g3, _ := received(t, cfg, 400)
	require.NotEqual(t, g1, g3)
}

func TestDiscardDownByPredicate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := discard.New(discard.DefaultConfig())
		d.DropDownIf(func(m *stack.Message) bool { return m.Has(stack.OOB) })
		c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			if i == 0 {
				return []stack.Protocol{d}
			}
			return nil
		})
		a, b := c.Channels[0], c.Channels[1]
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), []byte("x")).Set(stack.OOB)))
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), []byte("y"))))
		synctest.Wait()
		require.Equal(t, 1, c.Recv[1].Len())
		_, down := d.Dropped()
		require.EqualValues(t, 1, down)
	})
}
