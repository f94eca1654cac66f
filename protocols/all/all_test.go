package all_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/protocols/ping"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestEveryShippedHeaderSizeEqualsEncodedLength checks the header of every
// protocol strata ships: Size must equal the encoded length, and decoding
// must give the header back.
func TestEveryShippedHeaderSizeEqualsEncodedLength(t *testing.T) {
	ids := stack.HeaderIDs()
	for _, want := range []uint16{stack.IDNAKACK, stack.IDUNICAST2, stack.IDSTABLE, stack.IDFRAG, stack.IDPING, stack.IDStaticPING, stack.IDMERGE3, stack.IDFDALL, stack.IDVerifySuspect, stack.IDGMS, stack.IDFLUSH, stack.IDStateTransfer, stack.IDGROUPFC} {
		require.Contains(t, ids, want)
	}
	stacktest.CheckHeaderSizes(t)
}

func TestEveryRegisteredProtocolHasDocumentedKeys(t *testing.T) {
	for _, pt := range stack.Registered() {
		require.NotEmpty(t, pt.Doc, pt.Name)
		for _, k := range pt.Keys {
			require.NotEmpty(t, k.Doc, "%s.%s has no doc", pt.Name, k.Key)
		}
		if pt.ID != 0 {
			require.Less(t, pt.ID, stack.IDUserMin, pt.Name)
		}
	}
}

// TestEveryProtocolsStatsHaveDistinctNames builds every registered
// protocol from its defaults: the stats it reports (counters declared with
// stat tags, and gauges) have names, and no name twice.
func TestEveryProtocolsStatsHaveDistinctNames(t *testing.T) {
	reporters := 0
	for _, pt := range stack.Registered() {
		cfg := pt.DefaultConfig()
		if c, ok := cfg.(*ping.DNSConfig); ok {
			c.Query = "group.example" // the one key without a default
		}
		p, err := pt.Build(cfg)
		require.NoError(t, err, pt.Name)
		sr, ok := p.(stack.StatsReporter)
		if !ok {
			continue
		}
		reporters++
		seen := map[string]bool{}
		for _, st := range sr.Stats() {
			require.NotEmpty(t, st.Name, pt.Name)
			require.False(t, seen[st.Name], "%s reports %s twice", pt.Name, st.Name)
			seen[st.Name] = true
		}
		require.NotEmpty(t, seen, pt.Name)
	}
	require.GreaterOrEqual(t, reporters, 19)
}

// FuzzShippedHeaders feeds every shipped protocol's header decoder.
func FuzzShippedHeaders(f *testing.F) {
	for id := range stack.HeaderIDs() {
		for _, h := range stack.HeaderSamples(id) {
			f.Add(id, h.AppendTo(nil))
		}
	}
	f.Fuzz(func(t *testing.T, id uint16, body []byte) {
		h, err := stack.DecodeHeader(id, body)
		if err != nil {
			if !errors.Is(err, stack.ErrMalformed) {
				t.Fatal(err)
			}
			return
		}
		if enc := h.AppendTo(nil); h.Size() != len(enc) {
			t.Fatalf("decoded header %v: Size %d, encoded %d", h, h.Size(), len(enc))
		}
	})
}

// mustGroupFC returns ch's GROUPFC layer; the stack has one.
func mustGroupFC(ch *stack.Channel) *groupfc.GROUPFC {
	g, err := groupfc.Of(ch)
	if err != nil {
		panic(err)
	}
	return g
}
