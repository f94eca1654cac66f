package rpc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/rpc"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// udpVars keeps a UDP stack on loopback, on free ports and a multicast
// group of its own.
func udpVars(tb testing.TB) map[string]string {
	port := func() string {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(tb, err)
		defer c.Close()
		return strconv.Itoa(c.LocalAddr().(*net.UDPAddr).Port)
	}
	bind := port()
	return map[string]string{
		"STRATA_BIND_ADDR":     "127.0.0.1",
		"STRATA_BIND_PORT":     bind,
		"STRATA_MCAST_ADDR":    fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT":    port(),
		"STRATA_INITIAL_HOSTS": "127.0.0.1:" + bind,
	}
}

// startUDP starts n members of config file on loopback, each with a
// Dispatcher answering with h, and waits for one view.
func startUDP(tb testing.TB, file string, n int, h rpc.Handler) ([]*stack.Channel, []*rpc.Dispatcher) {
	vars := udpVars(tb)
	var chs []*stack.Channel
	var ds []*rpc.Dispatcher
	for i := range n {
		ch, err := stack.New(stack.Shipped(file), stack.WithVars(vars), stack.WithName(stacktest.Names[i]))
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = ch.Close() })
		d, err := rpc.New(ch, h)
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = d.Close() })
		require.NoError(tb, ch.Connect(context.Background(), "rpc-bench"))
		chs, ds = append(chs, ch), append(ds, d)
	}
	stacktest.WaitForSameView(tb, 2*time.Minute, chs...)
	return chs, ds
}

// BenchmarkCallUDP: synchronous 64-byte calls from one goroutine between
// two members over UDP on loopback (the load; JGroups 2.12's
// UnicastTestRpc -sync does about 5K calls/s).
func BenchmarkCallUDP(b *testing.B) {
	chs, ds := startUDP(b, "udp.toml", 2, func(_ context.Context, req *stack.Message) ([]byte, error) {
		return req.Payload[:8], nil
	})
	payload := make([]byte, 64)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	start := time.Now()
	for b.Loop() {
		if _, err := ds[0].Call(ctx, chs[1].Address(), payload); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}

// TestCallOverUDP: Call and Cast on real sockets (loopback), and nothing
// left running after Close.
func TestCallOverUDP(t *testing.T) {
	stacktest.CheckLeaks(t)
	chs, ds := startUDP(t, "udp.toml", 3, func(_ context.Context, req *stack.Message) ([]byte, error) {
		return append([]byte("re:"), req.Payload...), nil
	})
	stacktest.LogStatsOnFailure(t, chs...)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rsp, err := ds[0].Call(ctx, chs[2].Address(), []byte("x"))
	require.NoError(t, err)
	require.Equal(t, "re:x", string(rsp))
	rsps, err := ds[1].Cast(ctx, nil, []byte("y"), rpc.WithMode(rpc.ModeMajority))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(rsps.Received()), 2)
}
