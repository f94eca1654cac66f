package configs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/configs"
	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func TestSimConfigStartsAGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t.Setenv("STRATA_SIM_NETWORK", t.Name())
		var chs []*stack.Channel
		var cols []*stacktest.Collector
		for _, name := range []string{"A", "B", "C"} {
			col := stacktest.NewCollector()
			ch, err := stack.NewChannelFromFS(configs.FS, "sim.toml", stack.WithName(name), stack.WithReceiver(col))
			require.NoError(t, err)
			require.NoError(t, ch.Connect(context.Background(), "demo"))
			t.Cleanup(func() { _ = ch.Close() })
			chs, cols = append(chs, ch), append(cols, col)
		}
		addrs := []stack.Address{chs[0].Address(), chs[1].Address(), chs[2].Address()}
		stacktest.InjectView(t, stack.NewView(addrs[0], 2, addrs...), chs...)
		for i, ch := range chs {
			require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 8))))
		}
		synctest.Wait()
		for _, col := range cols {
			require.Empty(t, col.CheckExactlyOnce(addrs, 1, true))
		}
	})
}

func TestUDPConfigStartsAGroupOnLoopback(t *testing.T) {
	t.Setenv("STRATA_BIND_PORT", "0")
	t.Setenv("STRATA_MCAST_ADDR", fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)))
	t.Setenv("STRATA_MCAST_PORT", strconv.Itoa(freePort(t)))
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for _, name := range []string{"A", "B"} {
		col := stacktest.NewCollector()
		ch, err := stack.NewChannelFromFS(configs.FS, "udp.toml", stack.WithName(name), stack.WithReceiver(col))
		require.NoError(t, err)
		require.NoError(t, ch.Connect(context.Background(), "udp-demo"))
		t.Cleanup(func() { _ = ch.Close() })
		chs, cols = append(chs, ch), append(cols, col)
	}
	addrs := []stack.Address{chs[0].Address(), chs[1].Address()}
	stacktest.InjectView(t, stack.NewView(addrs[0], 2, addrs...), chs...) // no GMS yet
	for i, ch := range chs {
		require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 8))))
	}
	for _, col := range cols {
		stacktest.WaitFor(t, 10*time.Second, func() bool { return col.Len() == 2 }, "both multicasts arrive")
		require.Empty(t, col.CheckExactlyOnce(addrs, 1, true))
	}
}

func freePort(t *testing.T) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}
