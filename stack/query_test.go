package stack_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// wrongAnswer answers EvGetDigest with another query's Reply, the one way
// to get an answer's type wrong.
type wrongAnswer struct{ stack.Base }

func (l *wrongAnswer) Name() string { return "WRONG" }
func (l *wrongAnswer) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if _, ok := ev.(stack.EvGetDigest); ok {
		return stack.Reply(stack.EvKnownMembers{}, []stack.Address{stack.NewAddress()}), nil
	}
	return l.PassDownEvent(ctx, ev)
}

func TestAskReturnsTheAnswerOfTheLayerThatAnswers(t *testing.T) {
	want := stack.Digest{{Member: stack.NewAddress(), HighestDelivered: 7}}
	ch, err := stack.New(stack.FromProtocols(&loopTransport{}, &digestLayer{d: want}, &passThrough{}))
	require.NoError(t, err)
	defer ch.Close()
	d, err := stack.Ask(t.Context(), stack.Of(ch), stack.EvGetDigest{})
	require.NoError(t, err)
	require.Equal(t, want, d)
}

func TestAskThatNoLayerAnswersIsNotSupported(t *testing.T) {
	ch, err := stack.New(stack.FromProtocols(&loopTransport{}, &passThrough{}))
	require.NoError(t, err)
	defer ch.Close()
	_, err = stack.Ask(t.Context(), stack.Of(ch), stack.EvGetDigest{})
	require.ErrorIs(t, err, stack.ErrNotSupported)
}

func TestAnswerOfTheWrongTypeIsAnErrorNotAZeroValue(t *testing.T) {
	ch, err := stack.New(stack.FromProtocols(&loopTransport{}, &wrongAnswer{}))
	require.NoError(t, err)
	defer ch.Close()
	_, err = stack.Ask(t.Context(), stack.Of(ch), stack.EvGetDigest{})
	require.ErrorContains(t, err, "answered with a []stack.Address, not a stack.Digest")
}

// evCheck is a protocol's own query, whose answer is an interface.
type evCheck struct{ stack.Answers[error] }

// checker answers evCheck with a nil error.
type checker struct{ stack.Base }

func (l *checker) Name() string { return "CHECKER" }
func (l *checker) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if e, ok := ev.(evCheck); ok {
		return stack.Reply(e, error(nil)), nil
	}
	return l.PassDownEvent(ctx, ev)
}

func TestANilAnswerOfAnInterfaceTypeIsAnAnswer(t *testing.T) {
	ch, err := stack.New(stack.FromProtocols(&loopTransport{}, &checker{}, &passThrough{}))
	require.NoError(t, err)
	defer ch.Close()
	v, err := stack.Ask(t.Context(), stack.Of(ch), evCheck{})
	require.NoError(t, err, "answered, with nil")
	require.NoError(t, v)
}
