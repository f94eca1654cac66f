package delay_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/delay"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func TestDelayHoldsDownAndUpInVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := delay.DefaultConfig()
		cfg.Down, cfg.Up = 3*time.Second, 2*time.Second
		c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			return []stack.Protocol{delay.New(cfg)}
		})
		a, b := c.Channels[0], c.Channels[1]
		start := time.Now()
		require.NoError(t, a.SendTo(t.Context(), b.Address(), []byte("x")))
		require.Equal(t, 3*time.Second, time.Since(start), "the sender waits for the down delay")
		stacktest.WaitFor(t, 10*time.Second, func() bool { return c.Recv[1].Len() == 1 }, "delivered")
		require.InDelta(t, float64(5*time.Second), float64(time.Since(start)), float64(2*stacktest.Poll))

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, a.SendTo(ctx, b.Address(), []byte("y")), context.DeadlineExceeded)
	})
}
