package udp_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// aliasPayload is message seq of sender from: its number, then bytes that
// depend on both, so a payload overwritten by any other datagram shows.
func aliasPayload(from byte, seq uint32, size int) []byte {
	p := make([]byte, max(size, 5))
	p[0] = from
	binary.BigEndian.PutUint32(p[1:], seq)
	for i := 5; i < len(p); i++ {
		p[i] = byte(uint32(from)*131 + seq*7 + uint32(i)*13)
	}
	return p
}

func aliasIntact(p []byte) bool {
	if len(p) < 5 {
		return false
	}
	return string(p) == string(aliasPayload(p[0], binary.BigEndian.Uint32(p[1:]), len(p)))
}

// TestReceivedPayloadsSurviveLaterDatagrams keeps some of the messages
// two members send each other (multicasts and unicasts of many sizes,
// bundled, with foreign datagrams the receivers drop in between) and
// checks at the end that every kept payload is as it was sent: the
// transport reads later datagrams into fresh bytes, and reuses a receive
// chunk only once nothing refers into it (garbage collections run during
// the test, so chunks are recycled while messages are kept).
//
// Not parallel: it runs for seconds, longer than the leak checks of the
// parallel tests allow for goroutines of others.
func TestReceivedPayloadsSurviveLaterDatagrams(t *testing.T) {
	cfg := testConfig(t)
	ms := startMembers(t, 2, "alias", cfg, nil)
	ks := []*stacktest.Keeper{{Intact: aliasIntact}, {Intact: aliasIntact}}
	for i, m := range ms {
		m.ch.SetReceiver(ks[i])
	}
	foreign := stack.EncodeBundle(nil, "another-cluster", stack.NewAddress(), true,
		stack.NewMessage(stack.Address{}, aliasPayload(9, 0, 30000)))
	attacker, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer attacker.Close()
	require.NoError(t, setMulticastLoopback(attacker))
	group := &net.UDPAddr{IP: net.ParseIP(cfg.McastAddr), Port: cfg.McastPort}

	rng := rand.New(rand.NewPCG(stacktest.Seed(t), 3))
	ctx := context.Background()
	const rounds, perRound = 60, 200
	var want [2]int64 // messages each member should have received
	seq := uint32(0)
	for r := range rounds {
		// Paced in rounds, so the kernel's socket buffers never overflow.
		for range perRound {
			from := rng.IntN(2)
			size := 5 + rng.IntN(3000)
			if rng.IntN(10) == 0 {
				size = 20000 + rng.IntN(30000)
			}
			seq++
			m := stack.NewMessage(stack.Address{}, aliasPayload(byte(from), seq, size))
			if rng.IntN(2) == 0 {
				m.Dest = ms[1-from].ch.Address()
				want[1-from]++
			} else {
				want[0]++
				want[1]++ // a multicast is looped back to its sender
			}
			require.NoError(t, ms[from].ch.Send(ctx, m))
			if rng.IntN(50) == 0 {
				_, err := attacker.WriteToUDP(foreign, group)
				require.NoError(t, err)
			}
		}
		stacktest.WaitFor(t, wait, func() bool { return ks[0].Got.Load() == want[0] && ks[1].Got.Load() == want[1] },
			"round %d delivered", r)
		if r%5 == 0 {
			runtime.GC()
		}
	}
	for i, k := range ks {
		require.Zero(t, k.Bad.Load(), "member %d received corrupt payloads", i)
		kept := k.Kept()
		for _, m := range kept {
			require.True(t, aliasIntact(m.Payload), "member %d: a kept payload was overwritten by a later datagram", i)
		}
		require.NotEmpty(t, kept)
	}
	require.Positive(t, stacktest.Stat(t, ms[0].udp, "dropped_wrong_cluster")+stacktest.Stat(t, ms[1].udp, "dropped_wrong_cluster"))
}
