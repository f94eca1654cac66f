package tcp_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// crcPayload is size bytes (at least 12): the sender, a sequence number,
// bytes that depend on both, and a CRC of all that.
func crcPayload(from byte, seq uint32, size int) []byte {
	p := make([]byte, max(size, 12))
	p[0] = from
	binary.BigEndian.PutUint32(p[1:], seq)
	for i := 5; i < len(p)-4; i++ {
		p[i] = byte(uint32(from)*131 + seq*7 + uint32(i)*13)
	}
	binary.BigEndian.PutUint32(p[len(p)-4:], crc32.ChecksumIEEE(p[:len(p)-4]))
	return p
}

func crcIntact(p []byte) bool {
	return len(p) >= 12 && binary.BigEndian.Uint32(p[len(p)-4:]) == crc32.ChecksumIEEE(p[:len(p)-4])
}

// TestReceivedPayloadsSurviveLaterFramesAndResets: two members of tcp.toml
// send each other multicasts and unicasts of many sizes (some fragmented),
// while their connections are reset now and then (the reliable layers
// resend what was lost, the readers start new receive chunks mid-frame),
// and garbage collections recycle receive chunks. Every payload arrives
// with its CRC intact, and every kept payload still has it at the end:
// the TCP reader never reads into bytes it handed out, and reuses a chunk
// only once nothing refers into it.
//
// Not parallel: it runs for seconds, longer than the leak checks of the
// parallel tests allow for goroutines of others.
func TestReceivedPayloadsSurviveLaterFramesAndResets(t *testing.T) {
	port := freeTCPPort(t)
	vars := map[string]string{
		"STRATA_BIND_PORT":     strconv.Itoa(port),
		"STRATA_INITIAL_HOSTS": fmt.Sprintf("127.0.0.1:%d", port),
	}
	fsys := configFS(t, "tcp.toml")
	ks := []*stacktest.Keeper{{Intact: crcIntact}, {Intact: crcIntact}}
	var chs []*stack.Channel
	for i := range 2 {
		ch, _ := startFromConfig(t, fsys, "tcp.toml", stacktest.Names[i], vars)
		ch.SetReceiver(ks[i])
		require.NoError(t, ch.Connect(context.Background(), "alias"))
		chs = append(chs, ch)
	}
	stacktest.WaitForSameView(t, wait, chs...)

	rng := rand.New(rand.NewPCG(stacktest.Seed(t), 4))
	ctx := context.Background()
	const rounds, perRound = 40, 300
	var want [2]int64
	seq := uint32(0)
	resets := 0
	for r := range rounds {
		for i := range perRound {
			from := rng.IntN(2)
			size := 12 + rng.IntN(3000)
			if rng.IntN(20) == 0 {
				size = 20000 + rng.IntN(100000) // above frag_size: fragments
			}
			seq++
			m := stack.NewMessage(stack.Address{}, crcPayload(byte(from), seq, size))
			if rng.IntN(2) == 0 {
				m.Dest = chs[1-from].Address()
				want[1-from]++
			} else {
				want[0]++
				want[1]++ // a multicast is looped back to its sender
			}
			require.NoError(t, chs[from].Send(ctx, m))
			if r%4 == 1 && i == perRound/2 {
				resets += transportOf(chs[rng.IntN(2)]).ResetConnections()
			}
		}
		stacktest.WaitFor(t, wait, func() bool { return ks[0].Got.Load() == want[0] && ks[1].Got.Load() == want[1] },
			"round %d delivered", r)
		if r%5 == 0 {
			runtime.GC()
		}
	}
	require.Positive(t, resets, "connections were reset")
	for i, k := range ks {
		require.Zero(t, k.Bad.Load(), "member %d received corrupt payloads", i)
		kept := k.Kept()
		for _, m := range kept {
			require.True(t, crcIntact(m.Payload), "member %d: a kept payload was overwritten by a later read", i)
		}
		require.NotEmpty(t, kept)
	}
}
