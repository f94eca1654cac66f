package stack_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
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
