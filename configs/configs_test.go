package configs_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/grouptest"
	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/protocols/groupfc"
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
			ch, err := stack.New(stack.Shipped("sim.toml"), stack.WithName(name), stack.WithReceiver(col))
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

// startFromConfig starts n members from a shipped config with vars, all at
// once, and waits until they are in one view; it returns them and how long
// that took.
// formTimeout bounds the wait for members started together to share one
// view. They normally find each other in discovery within a second; on a
// loaded machine two of them may each miss the other's discovery and start
// groups of their own, which MERGE3 (JGroups' intervals: announcements
// every 10-30 s, a check every 48 s) joins within about 80 s.
const formTimeout = 2 * time.Minute

func startFromConfig(t *testing.T, file string, n int, vars map[string]string) ([]*stack.Channel, []*stacktest.Collector, time.Duration) {
	t.Helper()
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i := range n {
		col := stacktest.NewCollector()
		log := &grouptest.SyncBuffer{}
		logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		ch, err := stack.New(stack.Shipped(file), stack.WithVars(vars), stack.WithName(stacktest.Names[i]), stack.WithReceiver(col), stack.WithLogger(logger))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("log of %s (%s):\n%s", stacktest.Names[i], ch.Address(), log.String())
			}
		})
		chs, cols = append(chs, ch), append(cols, col)
	}
	start := time.Now()
	errs := make(chan error, n)
	for _, ch := range chs {
		go func() { errs <- ch.Connect(context.Background(), "cfg-"+file) }()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	stacktest.WaitForSameView(t, formTimeout, chs...)
	return chs, cols, time.Since(start)
}

// checkMulticasts has every member multicast one message and waits until
// every member has every message, once.
func checkMulticasts(t *testing.T, chs []*stack.Channel, cols []*stacktest.Collector) {
	t.Helper()
	var addrs []stack.Address
	for i, ch := range chs {
		addrs = append(addrs, ch.Address())
		require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 8))))
	}
	for i, col := range cols {
		stacktest.WaitFor(t, 10*time.Second, func() bool { return col.Len() >= len(chs) }, "member %d gets every multicast", i)
		require.Empty(t, col.CheckExactlyOnce(addrs, 1, true))
	}
}

func TestUDPConfigFormsAFourMemberViewOnLoopback(t *testing.T) {
	t.Parallel()
	vars := mcastVars(t)
	chs, cols, took := startFromConfig(t, "udp.toml", 4, vars)
	t.Logf("udp.toml: 4 members in one view %s after start", took)
	checkMulticasts(t, chs, cols)
}

func TestUDPNoMulticastConfigFormsAFourMemberViewOnLoopback(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	vars := map[string]string{
		"STRATA_BIND_PORT":       strconv.Itoa(port),
		"STRATA_INITIAL_HOSTS":   fmt.Sprintf("127.0.0.1:%d", port),
		"STRATA_PING_PORT_RANGE": "6",
	}
	chs, cols, took := startFromConfig(t, "udp-nomcast.toml", 4, vars)
	t.Logf("udp-nomcast.toml: 4 members in one view %s after start", took)
	checkMulticasts(t, chs, cols)
}

// mcastVars binds a shipped UDP config to a free port and its own
// multicast group, so tests run in parallel and beside other programs.
func mcastVars(t *testing.T) map[string]string {
	return map[string]string{
		"STRATA_BIND_PORT":  strconv.Itoa(freePort(t)),
		"STRATA_MCAST_ADDR": fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT": strconv.Itoa(freePort(t)),
	}
}

func freePort(t *testing.T) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// counter is a state of one number, the count of multicasts applied.
type counter struct {
	*stacktest.Collector
	mu sync.Mutex
	n  int
}

func (c *counter) Receive(m *stack.Message) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	c.Collector.Receive(m)
}

func (c *counter) GetState(w io.Writer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := fmt.Fprint(w, c.n)
	return err
}

func (c *counter) SetState(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n, err = strconv.Atoi(string(b))
	return err
}

func (c *counter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// TestFlushConfigJoinsWithStateOnLoopback: three members from flush.toml
// exchange multicasts; a fourth joins with ConnectWithState and its count
// equals theirs, then stays equal as traffic goes on.
func TestFlushConfigJoinsWithStateOnLoopback(t *testing.T) {
	t.Parallel()
	vars := mcastVars(t)
	var chs []*stack.Channel
	var cs []*counter
	for i := range 4 {
		c := &counter{Collector: stacktest.NewCollector()}
		ch, err := stack.New(stack.Shipped("flush.toml"), stack.WithVars(vars), stack.WithName(stacktest.Names[i]), stack.WithReceiver(c))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		chs, cs = append(chs, ch), append(cs, c)
	}
	for _, ch := range chs[:3] {
		require.NoError(t, ch.Connect(t.Context(), "flush-cfg"))
	}
	stacktest.WaitForSameView(t, formTimeout, chs[:3]...)
	for i, ch := range chs[:3] {
		for k := range 10 {
			require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, k, 8))))
		}
	}
	stacktest.WaitFor(t, 10*time.Second, func() bool { return cs[0].get() == 30 && cs[1].get() == 30 && cs[2].get() == 30 }, "30 multicasts everywhere")
	require.NoError(t, chs[3].ConnectWithState(t.Context(), "flush-cfg", stack.Address{}))
	require.Equal(t, 30, cs[3].get(), "the joiner's state is the group's count")
	for i, ch := range chs {
		require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 100, 8))))
	}
	stacktest.WaitFor(t, 10*time.Second, func() bool {
		for _, c := range cs {
			if c.get() != 34 {
				return false
			}
		}
		return true
	}, "every member counts 34")
}

// TestGroupFCConfigOnLoopback: three members from groupfc.toml, instances
// 1, 2, 2: a broadcast reaches the others, an anycast to instance 2 goes
// to one of its two members.
func TestGroupFCConfigOnLoopback(t *testing.T) {
	t.Parallel()
	vars := mcastVars(t)
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i, inst := range []string{"1", "2", "2"} {
		vars["STRATA_GROUP_INSTANCE"] = inst
		col := stacktest.NewCollector()
		ch, err := stack.New(stack.Shipped("groupfc.toml"), stack.WithVars(vars), stack.WithName(stacktest.Names[i]), stack.WithReceiver(col))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		chs, cols = append(chs, ch), append(cols, col)
	}
	for _, ch := range chs {
		require.NoError(t, ch.Connect(t.Context(), "groupfc-cfg"))
	}
	stacktest.WaitForSameView(t, formTimeout, chs...)
	g, err := groupfc.Of(chs[0])
	require.NoError(t, err)
	require.NoError(t, g.Broadcast(t.Context(), []byte("hello")))
	to, err := g.Anycast(t.Context(), 2, []byte("one of you"))
	require.NoError(t, err)
	require.Contains(t, []stack.Address{chs[1].Address(), chs[2].Address()}, to)
	stacktest.WaitFor(t, 10*time.Second, func() bool { return cols[1].Len()+cols[2].Len() == 3 }, "the broadcast twice and the anycast once")
}
