package flush

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestLargeHeadersAreCarriedInThePayload: a START_FLUSH naming 100
// participants goes as a CARRIED header with its encoding as the payload,
// which FRAG can split; a small header stays a header. Both come back as
// sent.
func TestLargeHeadersAreCarriedInThePayload(t *testing.T) {
	var ps []stack.Address
	for range 100 {
		ps = append(ps, stack.NewAddress())
	}
	big := &Header{Type: typeStart, Round: RoundID{Initiator: ps[0], N: 7}, ViewChange: true, Participants: ps}
	wh, payload := carried(big)
	require.Equal(t, typeCarried, wh.Type)
	require.LessOrEqual(t, wh.Size(), maxInline)
	got, err := uncarried(payload)
	require.NoError(t, err)
	require.Equal(t, big, got)

	small := &Header{Type: typeStop, Round: RoundID{Initiator: ps[0], N: 7}}
	wh, payload = carried(small)
	require.Same(t, small, wh)
	require.Nil(t, payload)
}

// FuzzCarried feeds the decoder of a CARRIED message's payload: it returns
// a header or an error, never panics.
func FuzzCarried(f *testing.F) {
	for _, h := range sampleHeaders() {
		f.Add(h.AppendTo(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := uncarried(b)
		if err == nil {
			require.NotEqual(t, typeCarried, h.Type)
		}
	})
}
