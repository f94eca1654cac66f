package udp

import (
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/strata-go/strata/internal/transport"
	"github.com/strata-go/strata/stack"
)

// Config configures UDP.
type Config struct {
	BindAddr   string     `toml:"bind_addr" doc:"address to bind: an IPv4 address, an interface name, or loopback | site_local | non_loopback"`
	BindPort   int        `toml:"bind_port" doc:"first unicast port to try (0: any free port)"`
	PortRange  int        `toml:"port_range" doc:"how many ports above bind_port to try if it is taken"`
	IPMcast    bool       `toml:"ip_mcast" doc:"use IP multicast; false sends each group message as one unicast per member"`
	McastAddr  string     `toml:"mcast_addr" doc:"IPv4 multicast group of the cluster"`
	McastPort  int        `toml:"mcast_port" doc:"port of the multicast group"`
	IPTTL      int        `toml:"ip_ttl" doc:"TTL of multicast datagrams (0: this host only, 1: this link)"`
	McastLoop  bool       `toml:"mcast_loopback" doc:"let multicasts reach other members on this host (own copies are dropped)"`
	BundleSize stack.Size `toml:"max_bundle_size" doc:"largest datagram the bundler sends; larger messages need FRAG"`
	QueueLen   int        `toml:"bundler_queue" doc:"messages the bundler queue holds before senders block (or drop)"`
	DropFull   bool       `toml:"drop_when_full" doc:"drop and count messages when the bundler queue is full, instead of blocking the sender"`
	BatchSize  int        `toml:"batch_size" doc:"datagrams per recvmmsg/sendmmsg call"`
	MaxQueued  stack.Size `toml:"max_queued_bytes" doc:"received bytes waiting for delivery per sender (regular lane) or per lane (OOB, internal); more are dropped and counted, and the reliable layers fetch them again (0: no bound)"`

	UcastRecvBuf stack.Size `toml:"ucast_recv_buf_size" doc:"receive buffer of the unicast socket"`
	UcastSendBuf stack.Size `toml:"ucast_send_buf_size" doc:"send buffer of the unicast socket"`
	McastRecvBuf stack.Size `toml:"mcast_recv_buf_size" doc:"receive buffer of the multicast socket"`

	CacheExpiry   time.Duration `toml:"logical_addr_cache_expiration" doc:"how long the physical address of a member no longer in the view is kept"`
	CacheMax      int           `toml:"logical_addr_cache_max_size" doc:"most physical addresses kept; beyond it a new one pushes out a non-member's"`
	WhoHasTimeout time.Duration `toml:"who_has_cache_timeout" doc:"least time between two requests to discovery for the same unknown address"`
}

// MaxDatagram is max_bundle_size, for the loader's check of FRAG's
// frag_size.
func (c *Config) MaxDatagram() stack.Size { return c.BundleSize }

// DefaultConfig returns UDP's defaults: loopback, multicast on 228.8.8.8:45588
// with TTL 1, 64KB bundles.
func DefaultConfig() Config {
	return Config{
		BindAddr: "127.0.0.1", BindPort: 7800, PortRange: 50,
		IPMcast: true, McastAddr: "228.8.8.8", McastPort: 45588, IPTTL: 1, McastLoop: true,
		BundleSize: 64000, QueueLen: 10000, BatchSize: 64, MaxQueued: stack.DefaultMaxQueued,
		UcastRecvBuf: 4 << 20, UcastSendBuf: 1 << 20, McastRecvBuf: 4 << 20,
		CacheExpiry: 360 * time.Second, CacheMax: 2000, WhoHasTimeout: 2 * time.Second,
	}
}

// maxDatagram is the largest UDP payload over IPv4.
const maxDatagram = 65507

// Validate checks the config, and that bind_addr names an address or
// interface of this machine (a config is checked where it runs).
func (c *Config) Validate() error {
	switch {
	case c.BindAddr == "":
		return stack.BadKey("bind_addr", "must not be empty (an address, an interface name, or loopback | site_local | non_loopback)")
	case c.BindPort < 0 || c.BindPort > 65535:
		return stack.BadKey("bind_port", "must be 0..65535, got %d", c.BindPort)
	case c.PortRange < 0 || c.BindPort+c.PortRange > 65535:
		return stack.BadKey("port_range", "must be >= 0 with bind_port+port_range <= 65535, got %d", c.PortRange)
	case c.IPTTL < 0 || c.IPTTL > 255:
		return stack.BadKey("ip_ttl", "must be 0..255, got %d", c.IPTTL)
	case c.BundleSize < 1024 || c.BundleSize > maxDatagram:
		return stack.BadKey("max_bundle_size", "must be between 1KB and %d bytes, got %d", maxDatagram, c.BundleSize)
	case c.QueueLen <= 0:
		return stack.BadKey("bundler_queue", "must be > 0, got %d", c.QueueLen)
	case c.BatchSize < 1 || c.BatchSize > 1024:
		return stack.BadKey("batch_size", "must be 1..1024, got %d", c.BatchSize)
	case c.MaxQueued != 0 && c.MaxQueued < c.BundleSize:
		return stack.BadKey("max_queued_bytes", "must be 0 (no bound) or at least max_bundle_size (%d), got %d", c.BundleSize, c.MaxQueued)
	case c.UcastRecvBuf <= 0:
		return stack.BadKey("ucast_recv_buf_size", "must be > 0, got %d", c.UcastRecvBuf)
	case c.UcastSendBuf <= 0:
		return stack.BadKey("ucast_send_buf_size", "must be > 0, got %d", c.UcastSendBuf)
	case c.McastRecvBuf <= 0:
		return stack.BadKey("mcast_recv_buf_size", "must be > 0, got %d", c.McastRecvBuf)
	case c.CacheExpiry <= 0:
		return stack.BadKey("logical_addr_cache_expiration", "must be > 0, got %s", c.CacheExpiry)
	case c.CacheMax < 2:
		return stack.BadKey("logical_addr_cache_max_size", "must be >= 2, got %d", c.CacheMax)
	case c.WhoHasTimeout <= 0:
		return stack.BadKey("who_has_cache_timeout", "must be > 0, got %s", c.WhoHasTimeout)
	}
	if c.IPMcast {
		ip, err := netip.ParseAddr(c.McastAddr)
		if err != nil || !ip.Is4() || !ip.IsMulticast() {
			return stack.BadKey("mcast_addr", "must be an IPv4 multicast address (224.0.0.0/4), got %q", c.McastAddr)
		}
		if c.McastPort <= 0 || c.McastPort > 65535 {
			return stack.BadKey("mcast_port", "must be 1..65535, got %d", c.McastPort)
		}
	}
	if _, _, err := resolveBindAddr(c.BindAddr); err != nil {
		return stack.BadKey("bind_addr", "%s", strings.TrimPrefix(err.Error(), "bind_addr "))
	}
	return nil
}

// resolveBindAddr turns bind_addr into an IPv4 address of this machine and
// the interface that holds it (shared with TCP).
func resolveBindAddr(s string) (netip.Addr, *net.Interface, error) {
	return transport.ResolveBindAddr(s)
}
