package stack

import (
	"context"
	"fmt"
)

// Answers is embedded by an event that answers with an R, which makes the
// event a Query[R]: the answer's type is written in the event's own type.
type Answers[R any] struct{}

func (Answers[R]) answers(R) {}

// Query is an event whose answer is an R (it embeds Answers[R]). Ask it
// with Ask or AskUp; a layer answers it with Reply.
type Query[R any] interface {
	answers(R)
}

// Answer is what DownEvent and UpEvent return: nothing (the zero Answer),
// or a query's answer made by Reply. A layer passes on the Answer it got
// from the layer below or above; only Ask and AskUp read it.
type Answer struct {
	v any // nil: no answer; nilAnswer: a nil interface value
}

// nilAnswer stands for a nil answer of an interface type, so that the
// Answer stays as small as an any.
type nilAnswer struct{}

// Reply answers q with r; the compiler checks that r is of q's answer type.
func Reply[R any](q Query[R], r R) Answer {
	if v := any(r); v != nil {
		return Answer{v: v}
	}
	return Answer{v: nilAnswer{}}
}

// Asker is what Ask sends a query down from: a protocol (any type embedding
// Base) asks the layers below it; a *Stack asks its layers from the top.
type Asker interface {
	askDown(ctx context.Context, ev Event) (Answer, error)
}

func (b *Base) askDown(ctx context.Context, ev Event) (Answer, error) {
	return b.PassDownEvent(ctx, ev)
}

func (s *Stack) askDown(ctx context.Context, ev Event) (Answer, error) {
	return s.top.PassDownEvent(ctx, ev)
}

// Ask sends q down from from and returns its answer. If no layer answers,
// the error wraps ErrNotSupported.
func Ask[R any](ctx context.Context, from Asker, q Query[R]) (R, error) {
	a, err := from.askDown(ctx, q)
	return answerOf[R](q, a, err)
}

// AskUp sends q up from p and returns its answer. If no layer answers, the
// error wraps ErrNotSupported.
func AskUp[R any](p Protocol, q Query[R]) (R, error) {
	a, err := p.base().PassUpEvent(q)
	return answerOf[R](q, a, err)
}

// answerOf unpacks a: the one place an answer's type is checked. Reply
// makes a mismatch impossible short of answering one query with another's
// Reply, which is an error here, never a zero value.
func answerOf[R any](q Event, a Answer, err error) (R, error) {
	var r R
	if err != nil {
		return r, err
	}
	switch a.v.(type) {
	case nil:
		return r, fmt.Errorf("strata: no layer answers %T: %w", q, ErrNotSupported)
	case nilAnswer:
		return r, nil
	}
	r, ok := a.v.(R)
	if !ok {
		return r, fmt.Errorf("strata: %T answered with a %T, not a %T", q, a.v, r)
	}
	return r, nil
}
