package stack_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

var errJoinFailed = errors.New("the join failed after its view")

// leaveAnswerer joins with a view of its own, then fails the connect; the
// leave that follows is answered with a view installed on a goroutine of
// its own, which the leave waits for, as GMS's leave waits for the
// coordinator's answer coming up the stack; one more view comes as the
// stack stops.
type leaveAnswerer struct {
	stack.Base
	views int
}

func (l *leaveAnswerer) Name() string { return "LEAVE_ANSWERER" }

func (l *leaveAnswerer) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	self := l.LocalAddress()
	switch ev.(type) {
	case stack.EvConnect:
		l.views++
		_, _ = l.PassUpEvent(stack.EvViewChange{View: stack.NewView(self, 1, self)})
		return stack.Answer{}, errJoinFailed
	case stack.EvDisconnect:
		answered := make(chan struct{})
		l.Go(func(<-chan struct{}) {
			defer close(answered)
			l.views++
			_, _ = l.PassUpEvent(stack.EvViewChange{View: stack.NewView(self, 2, self)})
		})
		<-answered
		return stack.Answer{}, nil
	}
	return l.PassDownEvent(ctx, ev)
}

// Stop installs one more view: one that came in after the leave, as the
// stack stops.
func (l *leaveAnswerer) Stop() {
	self := l.LocalAddress()
	l.views++
	_, _ = l.PassUpEvent(stack.EvViewChange{View: stack.NewView(self, 3, self)})
}

// TestFailedConnectLeavesWhileAViewComesIn: a connect that fails after its
// first view leaves the group, and a view installed during that leave
// goes up to the channel rather than waiting for a lock the failed
// connect holds until its stop, which waits for that view (under synctest
// the wait on the lock stopped virtual time for good). The member ends
// up not connected (a view that comes in as the stack stops does not
// change that), and connects again.
func TestFailedConnectLeavesWhileAViewComesIn(t *testing.T) {
	l := &leaveAnswerer{}
	ch, err := stack.New(stack.FromProtocols(&loopTransport{}, l))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- ch.Connect(context.Background(), "leave") }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Connect did not return: its stop waits for the leave's view, which waits for the channel's lock")
	}
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	require.ErrorIs(t, err, errJoinFailed)
	require.Equal(t, 3, l.views, "the leave's view and the last one went up")
	require.ErrorIs(t, ch.SendTo(t.Context(), stack.Address{}, []byte("x")), stack.ErrNotConnected, "a view after the leave left the member connected")
	require.ErrorIs(t, ch.Connect(t.Context(), "leave"), errJoinFailed, "a second connect runs (and fails the same way)")
	require.Equal(t, 6, l.views)
}
