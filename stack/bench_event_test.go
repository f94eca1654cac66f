package stack_test

import (
	"context"
	"testing"

	"github.com/strata-go/strata/stack"
)

// digestLayer answers EvGetDigest with a fixed digest.
type digestLayer struct {
	stack.Base
	d stack.Digest
}

func (l *digestLayer) Name() string { return "DIGEST" }
func (l *digestLayer) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if e, ok := ev.(stack.EvGetDigest); ok {
		return stack.Reply(e, l.d), nil
	}
	return l.PassDownEvent(ctx, ev)
}

// BenchmarkQuery10Layers asks a query through ten layers that pass it on.
func BenchmarkQuery10Layers(b *testing.B) {
	protos := []stack.Protocol{&loopTransport{}, &digestLayer{d: stack.Digest{}}}
	for range 10 {
		protos = append(protos, &passThrough{})
	}
	ch, err := stack.New(stack.FromProtocols(protos...))
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := stack.Ask(ctx, stack.Of(ch), stack.EvGetDigest{})
		if err != nil {
			b.Fatal(err)
		}
		if d == nil {
			b.Fatal("no digest")
		}
	}
}
