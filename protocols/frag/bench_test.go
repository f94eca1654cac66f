package frag_test

import (
	"fmt"
	"testing"

	"github.com/strata-go/strata/protocols/frag"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// BenchmarkReceiveWithPendingPartials: FRAG's receive path (a batch of 64
// messages of 1 KB, then one message in two fragments) with no partial
// message pending and with 1,000 of them (one-byte fragments of messages
// announcing nearly 1 GiB, from a member). The cost per message must not
// grow with the partials pending.
func BenchmarkReceiveWithPendingPartials(b *testing.B) {
	for _, pending := range []int{0, 1000} {
		b.Run(fmt.Sprint("pending=", pending), func(b *testing.B) {
			cfg := frag.DefaultConfig()
			cfg.FragSize = 1000
			sink := &sink{}
			c := stacktest.StartSIM(b, 1, 1, func(int) []stack.Protocol { return []stack.Protocol{frag.New(cfg), sink} })
			f := stack.Of(c.Channels[0]).Find("FRAG").(*frag.FRAG)
			src := stack.NewAddress()
			fs := int(cfg.FragSize)
			big := make([]byte, 2*fs)
			msgs := make([]*stack.Message, 64)
			for i := range msgs {
				msgs[i] = stack.NewMessage(stack.Address{}, make([]byte, 1000))
				msgs[i].Src = src
			}
			b.SetBytes(int64(len(msgs)*1000 + len(big)))
			hf := func(id uint64) *stack.Message { // hostileFragment for this frag_size
				const total = (1<<30-1)/1000*1000 + 1 // one byte in the last fragment
				m := stack.NewMessage(stack.Address{}, []byte{1})
				m.Src = src
				m.PutHeader(stack.IDFRAG, &frag.Header{ID: id, Index: total / 1000, Count: total/1000 + 1, Total: total})
				return m
			}
			for i := range pending {
				f.Up(hf(uint64(1<<40 + i)))
			}
			b.ReportAllocs()
			id := uint64(0)
			for b.Loop() {
				f.UpBatch(&stack.Batch{Src: src, Lane: stack.LaneRegular, Msgs: append([]*stack.Message(nil), msgs...)})
				id++
				for i, p := range [][]byte{big[:fs], big[fs:]} {
					m := stack.NewMessage(stack.Address{}, p)
					m.Src = src
					m.PutHeader(stack.IDFRAG, &frag.Header{ID: id, Index: uint32(i), Count: 2, Total: uint64(len(big))})
					f.Up(m)
				}
			}
			b.ReportMetric(float64(b.N)*65/b.Elapsed().Seconds(), "msgs/s")
			if got := stacktest.Stat(b, f, "partial_in_progress"); got != int64(pending) {
				b.Fatalf("%d partial messages pending, want %d", got, pending)
			}
			if want := int64(b.N) * 65; sink.n != want {
				b.Fatalf("%d messages passed up, want %d", sink.n, want)
			}
		})
	}
}

// sink counts what reaches it and passes nothing up.
type sink struct {
	stack.Base
	n int64
}

func (s *sink) Name() string            { return "SINK" }
func (s *sink) Up(*stack.Message)       { s.n++ }
func (s *sink) UpBatch(bt *stack.Batch) { s.n += int64(len(bt.Msgs)) }
