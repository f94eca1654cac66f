package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/grouptest"
	"github.com/strata-go/strata/protocols/auth"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// add builds a lab member with AUTH below GMS and the given secret.
func add(t *testing.T, l *grouptest.Lab, secret string) (*grouptest.Member, *auth.Auth) {
	m := l.Add()
	a := auth.New(auth.DefaultConfig())
	require.NoError(t, a.SetSecret([]byte(secret)))
	require.NoError(t, m.Ch.Stack().InsertBelow(a, "GMS"))
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
