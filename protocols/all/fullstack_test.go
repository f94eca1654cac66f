package all_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestFullStackOnUDPUnderLoss composes the shipped protocols on real
// sockets: UDP | DISCARD (10% loss each way) | NAKACK | UNICAST2 | STABLE |
// FRAG, three members on loopback, multicasts and unicasts of up to 150 KB.
func TestFullStackOnUDPUnderLoss(t *testing.T) {
	stacktest.CheckLeaks(t)
	port := func() int {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	cfg := fmt.Sprintf(`
[[protocol]]
type = "UDP"
bind_addr = "127.0.0.1"
bind_port = 0
mcast_addr = "239.%d.%d.%d"
mcast_port = %d
ip_ttl = 0
[[protocol]]
type = "DISCARD"
up = 0.1
down = 0.1
seed = %d
[[protocol]]
type = "NAKACK"
xmit_interval = "50ms"
[[protocol]]
type = "UNICAST2"
xmit_interval = "50ms"
stable_interval = "200ms"
[[protocol]]
type = "STABLE"
desired_avg_gossip = "200ms"
[[protocol]]
type = "FRAG"
frag_size = "8KB"
`, 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254), port(), stacktest.Seed(t))
	const n, per = 3, 100
	c := stacktest.Start(t, n, func(i int) []stack.Protocol {
		sc, err := stack.ParseConfig("full.toml", []byte(cfg))
		require.NoError(t, err)
		protos, err := sc.Build()
		require.NoError(t, err)
		return protos
	})
	// Discovery is not in this stack: tell each member where the others are.
	for _, a := range c.Channels {
		for _, b := range c.Channels {
			if a != b {
				pa, err := stack.Ask(context.Background(), stack.Of(b), stack.EvGetLocalPhysicalAddress{})
				require.NoError(t, err)
				err = stack.Of(a).DownEvent(context.Background(), stack.EvAddPhysicalAddress{Logical: b.Address(), Physical: pa})
				require.NoError(t, err)
			}
		}
	}
	c.InjectView(t)
	addrs := c.Addresses()
	var wg sync.WaitGroup
	for i, ch := range c.Channels {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for s := range per {
				p := stacktest.Payload(i, s, 8+rng.IntN(150_000))
				if !assert.NoError(t, ch.Send(context.Background(), stack.NewMessage(stack.Address{}, p))) {
					return
				}
				if !assert.NoError(t, ch.Send(context.Background(), stack.NewMessage(addrs[(i+1)%n], p))) {
					return
				}
			}
		})
	}
	wg.Wait()
	if !stacktest.Eventually(2*time.Minute, func() bool {
		for _, r := range c.Recv {
			if r.Len() != n*per+per {
				return false
			}
		}
		return true
	}) {
		for j, ch := range c.Channels {
			t.Logf("member %d received %d of %d", j, c.Recv[j].Len(), n*per+per)
			for _, ps := range ch.Stats() {
				t.Logf("  %s %v", ps.Protocol, ps.Stats)
			}
		}
		t.Fatal("not every member got every multicast and its unicasts")
	}
	for j, r := range c.Recv {
		seen := map[[2]int]int{}
		for _, m := range r.Messages() {
			i, s, ok := stacktest.ParsePayload(m.Payload)
			require.True(t, ok)
			seen[[2]int{i, s}]++
		}
		for i := range n {
			for s := range per {
				want := 1
				if (i+1)%n == j {
					want = 2 // the multicast and the unicast
				}
				require.Equal(t, want, seen[[2]int{i, s}], "member %d: message %d/%d", j, i, s)
			}
		}
	}
	c.Close()
}
