package stack_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// namedLayer forwards everything, under a name of its own.
type namedLayer struct {
	stack.Base
	name string
}

func (l *namedLayer) Name() string { return l.name }

// installer stands for the membership layer: it makes the views, keeps its
// own and passes each one down and up, as GMS does.
type installer struct {
	stack.Base
	view *stack.View
}

func (l *installer) Name() string { return "MEMBERSHIP" }
func (l *installer) InstallView(ctx context.Context, v *stack.View) error {
	l.view = v
	_, _ = l.PassDownEvent(ctx, stack.EvViewChange{View: v})
	_, _ = l.PassUpEvent(stack.EvViewChange{View: v})
	return nil
}

var _ stack.ViewInstaller = (*installer)(nil)

// TestBaseKeepsNoViewForTheMembershipLayer: the layers above and below the
// membership layer read its views through Base.View; the membership layer
// has one view only, its own, even when a VIEW_CHANGE passes through it.
func TestBaseKeepsNoViewForTheMembershipLayer(t *testing.T) {
	below, above, mem := &namedLayer{name: "BELOW"}, &namedLayer{name: "ABOVE"}, &installer{}
	ch, err := stack.New(stack.FromProtocols(&loopTransport{}, below, mem, above))
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Connect(t.Context(), "views"))
	v := ch.View()
	require.Same(t, v, mem.view, "the channel's first view came from the membership layer")
	require.Same(t, v, below.View())
	require.Same(t, v, above.View())
	require.Nil(t, mem.Base.View(), "Base holds no second view for the membership layer")

	// A VIEW_CHANGE that a layer above passes down goes through the
	// membership layer and leaves no copy in its Base either.
	next := stack.NewView(ch.Address(), 2, ch.Address())
	_, err = above.PassDownEvent(t.Context(), stack.EvViewChange{View: next})
	require.NoError(t, err)
	require.Same(t, next, below.View())
	require.Nil(t, mem.Base.View())
}
