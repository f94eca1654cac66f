package stack_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// gated is a blocking layer built on stack.Gate, as FLUSH and flow control are.
type gated struct {
	stack.Base
	gate stack.Gate
}

func (g *gated) Name() string { return "GATED" }
func (g *gated) Down(ctx context.Context, m *stack.Message) error {
	if err := g.gate.Wait(ctx, m); err != nil {
		return err
	}
	return g.PassDown(ctx, m)
}

func TestInternalMessagesPassAClosedBlockingLayer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gated{}
		c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			if i == 0 {
				return []stack.Protocol{g}
			}
			return nil
		})
		a, b := c.Channels[0], c.Channels[1]
		g.gate.Close()
		sent := make(chan error, 1)
		go func() { sent <- a.SendTo(context.Background(), b.Address(), []byte("app")) }()
		synctest.Wait()
		require.Empty(t, sent, "application message is held by the closed gate")
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), []byte("ctl")).Set(stack.Internal)))
		synctest.Wait()
		require.Equal(t, []string{"ctl"}, payloads(c.Recv[1].Messages()))

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, a.SendTo(ctx, b.Address(), []byte("late")), context.DeadlineExceeded, "a held send honours ctx")

		g.gate.Open()
		require.NoError(t, <-sent)
		synctest.Wait()
		require.Equal(t, []string{"ctl", "app"}, payloads(c.Recv[1].Messages()))
	})
}

func payloads(ms []*stack.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Payload)
	}
	return out
}

// BenchmarkGateOpenPassage is FLUSH's per-multicast cost at the gate: a Wait
// and two IsClosed on an open gate, from both cores at once.
func BenchmarkGateOpenPassage(b *testing.B) {
	var g stack.Gate
	m := &stack.Message{}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if g.Wait(ctx, m) != nil || g.IsClosed() || g.IsClosed() {
				b.Fatal("the gate is open")
			}
		}
	})
}
