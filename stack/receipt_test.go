package stack_test

import (
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// splitter passes the first message of a batch up, then waits for go
// before it passes the rest (as a layer that handles one message of a
// batch itself does: FRAG completing a message).
type splitter struct {
	stack.Base
	first chan struct{} // closed once the first message is up
	goOn  chan struct{}
}

func (s *splitter) Name() string { return "SPLITTER" }

func (s *splitter) UpBatch(b *stack.Batch) {
	s.PassUp(b.Msgs[0])
	close(s.first)
	<-s.goOn
	b.Msgs = b.Msgs[1:]
	s.PassUpBatch(b)
}

// TestAdmittedMessagesComeBeforeALaterView: a layer passes up two messages
// with a receipt, admitted in the current view; a layer above splits them,
// and the first marks the receipt (a flush waiting for it may now install
// the next view). A view installed then reaches the application after
// both messages, not between them. (The chaos suite saw it between them:
// a message the flush had counted delivered in the old view reached the
// application in the new one.)
func TestAdmittedMessagesComeBeforeALaterView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := &splitter{first: make(chan struct{}), goOn: make(chan struct{})}
		var mu sync.Mutex
		var order []string
		note := func(s string) {
			mu.Lock()
			order = append(order, s)
			mu.Unlock()
		}
		net := stacktest.NewNetwork(t, 1)
		cfg := sim.DefaultConfig()
		cfg.Network = net.Name()
		ch, err := stack.New(stack.FromProtocols([]stack.Protocol{sim.New(cfg), sp}...), stack.WithReceiver(stack.ReceiverFuncs{
			OnReceive: func(m *stack.Message) { note(string(m.Payload)) },
			OnView:    func(v *stack.View) { note(v.ID.String()) },
		}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		require.NoError(t, ch.Connect(t.Context(), "receipt"))
		synctest.Wait()
		rc := stack.NewReceipt(stack.Of(ch), nil)
		a, b := stack.NewMessage(ch.Address(), []byte("a")), stack.NewMessage(ch.Address(), []byte("b"))
		a.Src, b.Src = ch.Address(), ch.Address()
		a.SetReceipt(rc)
		b.SetReceipt(rc)
		var wg sync.WaitGroup
		wg.Go(func() {
			rc.Admit()
			sp.UpBatch(&stack.Batch{Src: ch.Address(), Lane: stack.LaneRegular, Msgs: []*stack.Message{a, b}})
			rc.Release()
		})
		<-sp.first
		require.True(t, rc.Taken(), "the first message marked the receipt")
		cur := ch.View()
		next := stack.NewView(cur.ID.Creator, cur.ID.Seq+1, cur.Members...)
		require.NoError(t, stack.Of(ch).InstallView(t.Context(), next))
		synctest.Wait()
		close(sp.goOn)
		wg.Wait()
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{cur.ID.String(), "a", "b", next.ID.String()}, order, "the view comes after both messages")
	})
}
