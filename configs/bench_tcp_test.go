package configs_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/strata-go/strata/stack"
)

// tcpPair connects two members of tcp.toml on loopback (ports of their
// own, each in the other's initial_hosts); done is closed when B has
// received want messages.
func tcpPair(b *testing.B, want int64) (a, r *stack.Channel, done chan struct{}) {
	c, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := c.Addr().(*net.TCPAddr).Port
	_ = c.Close()
	hosts := "127.0.0.1:" + strconv.Itoa(port)
	return shippedPair(b, "tcp.toml", want, func(i int) map[string]string {
		return map[string]string{"STRATA_BIND_PORT": strconv.Itoa(port + i), "STRATA_INITIAL_HOSTS": hosts}
	})
}

// BenchmarkTCPStack1KB is BenchmarkUDPStack1KB on tcp.toml: 1 KB messages
// from A to B over loopback TCP, the whole stack at both ends, UFC and
// MFC as the only brake. allocs/msg and B/msg are per message sent (and
// received: both members are in this process), with the fraction that
// ReportAllocs rounds away.
func BenchmarkTCPStack1KB(b *testing.B) { benchStack1KB(b, tcpPair) }
