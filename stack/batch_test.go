package stack_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func TestBatchKeepPreservesOrderAndClearsTheTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop map[int]bool
	}{
		{"keeps all", nil},
		{"drops all", map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true}},
		{"drops the first", map[int]bool{0: true}},
		{"drops one in the middle", map[int]bool{2: true}},
		{"drops the last", map[int]bool{4: true}},
		{"drops every other", map[int]bool{1: true, 3: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var msgs []*stack.Message
			b := &stack.Batch{}
			for i := range 5 {
				m := stack.NewMessage(stack.Address{}, []byte{byte(i)})
				msgs = append(msgs, m)
				b.Add(m)
			}
			all := b.Msgs
			b.Keep(func(m *stack.Message) bool { return !tc.drop[int(m.Payload[0])] })
			var want []*stack.Message
			for i, m := range msgs {
				if !tc.drop[i] {
					want = append(want, m)
				}
			}
			require.Equal(t, len(want), b.Len())
			for i := range want {
				require.Same(t, want[i], b.Msgs[i])
			}
			for _, m := range all[len(want):] {
				require.Nil(t, m, "the dropped tail is cleared, so the batch does not keep messages alive")
			}
		})
	}
}

func headed(payload int, ids ...uint16) *stack.Message {
	m := stack.NewMessage(stack.Address{}, make([]byte, payload))
	for _, id := range ids {
		switch id {
		case idSeq:
			m.PutHeader(id, &seqHdr{Seq: 1})
		case idName:
			m.PutHeader(id, &nameHdr{Name: "n"})
		default:
			m.PutHeader(id, &addrHdr{})
		}
	}
	return m
}

// TestBatchSummaryFollowsTheBatch: what MayHave and PayloadBytes say holds
// through Keep and Add, and through direct writes to Msgs that change its
// length or backing array.
func TestBatchSummaryFollowsTheBatch(t *testing.T) {
	b := &stack.Batch{}
	require.False(t, b.MayHave(idSeq), "an empty batch has no headers")
	b.Add(headed(10, idSeq), headed(5))
	require.True(t, b.MayHave(idSeq))
	require.False(t, b.MayHave(idName))
	require.False(t, b.MayHaveFlags(stack.OOB))
	require.EqualValues(t, 15, b.PayloadBytes())

	b.Add(headed(7, idName).Set(stack.OOB))
	require.True(t, b.MayHave(idName), "Add keeps the summary true")
	require.True(t, b.MayHaveFlags(stack.OOB))
	require.EqualValues(t, 22, b.PayloadBytes())

	b.Keep(func(m *stack.Message) bool { return m.Header(idSeq) == nil })
	require.EqualValues(t, 12, b.PayloadBytes(), "Keep takes the bytes of what it removed")
	require.False(t, b.MayHave(idAddr))

	b.Msgs = append(b.Msgs, headed(3, idAddr))
	require.True(t, b.MayHave(idAddr), "a message appended to Msgs directly is seen")
	require.EqualValues(t, 15, b.PayloadBytes())

	b.Msgs = []*stack.Message{headed(1, idSeq)}
	require.True(t, b.MayHave(idSeq), "a new Msgs is seen")
	require.False(t, b.MayHave(idAddr))
	require.EqualValues(t, 1, b.PayloadBytes())

	b.Keep(func(*stack.Message) bool { return false })
	require.False(t, b.MayHave(idSeq))
	require.Zero(t, b.PayloadBytes())
}

// stamper puts a TEST_NAME header on every message of a batch in place
// (as a layer that decrypts or decompresses into the same slots would),
// and does not say it preserves batches.
type stamper struct{ stack.Base }

func (*stamper) Name() string { return "STAMPER" }

func (s *stamper) UpBatch(b *stack.Batch) {
	for _, m := range b.Msgs {
		m.PutHeader(idName, &nameHdr{Name: "stamped"})
	}
	s.PassUpBatch(b)
}

// seer counts the messages with a TEST_NAME header, skipping batches that
// MayHave says hold none.
type seer struct {
	stack.Base
	seen atomic.Int64
}

func (*seer) Name() string { return "SEER" }

func (s *seer) UpBatch(b *stack.Batch) {
	if b.MayHave(idName) {
		for _, m := range b.Msgs {
			if m.Header(idName) != nil {
				s.seen.Add(1)
			}
		}
	}
	s.PassUpBatch(b)
}

// TestBatchSummaryIsMadeAgainAboveALayerThatChangesMessages: the delivery
// lanes summarize each batch as they queue it (no TEST_NAME header); a
// layer that adds headers in place without being a BatchPreserver makes
// that summary void, so the layer above still finds its headers.
func TestBatchSummaryIsMadeAgainAboveALayerThatChangesMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		se := &seer{}
		c := stacktest.StartSIM(t, 2, stacktest.Seed(t), func(i int) []stack.Protocol {
			if i == 1 {
				return []stack.Protocol{&stamper{}, se}
			}
			return nil
		})
		const n = 50
		for i := range n {
			require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(c.Channels[1].Address(), []byte{byte(i)})))
		}
		stacktest.WaitFor(t, time.Second, func() bool { return c.Recv[1].Len() == n }, "all delivered")
		require.EqualValues(t, n, se.seen.Load(), "the layer above the stamper sees every stamped header")
	})
	stacktest.CheckLeaks(t)
}
