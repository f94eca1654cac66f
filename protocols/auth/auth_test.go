package auth_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/grouptest"
	"github.com/strata-go/strata/protocols/auth"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// add builds a lab member with AUTH below GMS and the given secret.
func add(t *testing.T, l *grouptest.Lab, secret string) (*grouptest.Member, *auth.Auth) {
	m := l.Add()
	a := auth.New(auth.DefaultConfig())
	require.NoError(t, a.SetSecret([]byte(secret)))
	require.NoError(t, stack.Of(m.Ch).InsertBelow(a, "GMS"))
	return m, a
}

// TestJoinerWithoutTheSecretIsRefused: members with the secret form a
// group; one with another secret gets "authentication failed" from Connect
// and is never in a view.
func TestJoinerWithoutTheSecretIsRefused(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		l := grouptest.New(t, seed)
		const secret = "the group's secret, 32 bytes ok!"
		a, aa := add(t, l, secret)
		l.ConnectAll(a)
		b, _ := add(t, l, secret)
		l.ConnectAll(b)
		stacktest.WaitFor(t, time.Minute, func() bool { return grouptest.SameView(a, b) }, "A and B in one view")
		c, _ := add(t, l, "not the secret at all, 32 bytes!")
		err := c.Ch.Connect(context.Background(), "test")
		require.ErrorIs(t, err, stack.ErrAuthFailed)
		require.ErrorContains(t, err, "authentication failed")
		for _, m := range []*grouptest.Member{a, b} {
			for _, v := range m.Col.Views() {
				require.False(t, v.Contains(c.Addr()), "%s never lists the refused joiner", m.Ch.Name())
			}
		}
		require.EqualValues(t, 1, stacktest.Stat(t, aa, "joiners_accepted"))
		require.Positive(t, stacktest.Stat(t, aa, "joiners_rejected"))
	})
}

// TestMergeNeedsTheSecretToo: two subgroups that were apart merge when they
// share the secret, and never merge when they do not.
func TestMergeNeedsTheSecretToo(t *testing.T) {
	for _, same := range []bool{true, false} {
		t.Run(map[bool]string{true: "same_secret", false: "other_secret"}[same], func(t *testing.T) {
			grouptest.Seeds(t, func(t *testing.T, seed uint64) {
				l := grouptest.New(t, seed)
				s1, s2 := "the first group's secret, 32 b!!", "the second group's secret, 32 b!"
				if same {
					s2 = s1
				}
				a, aa := add(t, l, s1)
				b, _ := add(t, l, s1)
				c, _ := add(t, l, s2)
				d, _ := add(t, l, s2)
				l.Net.Partition([]stack.Address{a.Addr(), b.Addr()}, []stack.Address{c.Addr(), d.Addr()})
				for _, m := range []*grouptest.Member{a, b, c, d} {
					l.ConnectAll(m)
				}
				stacktest.WaitFor(t, time.Minute, func() bool { return grouptest.SameView(a, b) && grouptest.SameView(c, d) }, "two subgroups")
				l.Net.Heal()
				if same {
					stacktest.WaitFor(t, 2*time.Minute, func() bool { return grouptest.SameView(a, b, c, d) }, "one merged view")
					return
				}
				time.Sleep(4 * (grouptest.MergeMax + grouptest.MergeCheck))
				require.True(t, grouptest.SameView(a, b), "A and B stay together")
				require.True(t, grouptest.SameView(c, d), "C and D stay together")
				for _, m := range []*grouptest.Member{a, b} {
					for _, v := range m.Col.Views() {
						require.False(t, v.Contains(c.Addr()) || v.Contains(d.Addr()), "no view of the first group lists the second")
					}
				}
				require.Positive(t, stacktest.Stat(t, aa, "joiners_rejected")+stacktest.Stat(t, aa, "rejected_here"), "the merge was refused")
			})
		})
	}
}

// rejectForger sits below a joiner's AUTH and, before the first CHALLENGE,
// passes up a REJECT in the challenger's name: what an attacker on the
// network who sees the JOIN_REQ could send.
type rejectForger struct {
	stack.Base
	forged atomic.Bool
}

func (f *rejectForger) Name() string { return "REJECT_FORGER" }
func (f *rejectForger) Up(m *stack.Message) {
	if h, ok := m.Header(stack.IDAUTH).(*auth.Header); ok && auth.IsChallenge(h) && f.forged.CompareAndSwap(false, true) {
		r := stack.NewMessage(f.LocalAddress(), nil).Set(stack.Internal | stack.OOB)
		r.Src = m.Src
		r.PutHeader(stack.IDAUTH, auth.Reject())
		f.PassUp(r)
	}
	f.PassUp(m)
}
func (f *rejectForger) UpBatch(b *stack.Batch) {
	for _, m := range b.Msgs {
		f.Up(m)
	}
}

// TestForgedRejectDoesNotTurnAwayAJoinerWithTheSecret: a REJECT in the
// coordinator's name reaches the joiner before the coordinator's
// challenge. The challenge proves the coordinator holds the secret, so the
// joiner takes the REJECT for a forgery and joins.
func TestForgedRejectDoesNotTurnAwayAJoinerWithTheSecret(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		l := grouptest.New(t, seed)
		const secret = "the group's secret, 32 bytes ok!"
		a, _ := add(t, l, secret)
		l.ConnectAll(a)
		b, ba := add(t, l, secret)
		f := &rejectForger{}
		require.NoError(t, stack.Of(b.Ch).InsertBelow(f, "AUTH"))
		require.NoError(t, b.Ch.Connect(context.Background(), "test"))
		stacktest.WaitFor(t, time.Minute, func() bool { return grouptest.SameView(a, b) }, "A and B in one view")
		require.True(t, f.forged.Load(), "a REJECT was forged")
		stacktest.WaitFor(t, time.Minute, func() bool { return stacktest.Stat(t, ba, "forged_rejects_ignored") == 1 }, "the forged REJECT counted")
		require.Zero(t, stacktest.Stat(t, ba, "challenges_without_proof"))
	})
}
