package tcp

import (
	"strings"
	"time"

	"github.com/strata-go/strata/internal/transport"
	"github.com/strata-go/strata/stack"
)

// Config configures TCP. Socket defaults are JGroups' (BasicTCP/TCP):
// tcp_nodelay on, 150000-byte socket buffers, a 2s connect timeout, 1s to
// read a new connection's preamble, 2000 frames queued per peer.
type Config struct {
	BindAddr   string     `toml:"bind_addr" doc:"address to listen on: an IPv4 address, an interface name, or loopback | site_local | non_loopback"`
	BindPort   int        `toml:"bind_port" doc:"first port to listen on (0: any free port)"`
	PortRange  int        `toml:"port_range" doc:"how many ports above bind_port to try if it is taken"`
	BundleSize stack.Size `toml:"max_bundle_size" doc:"largest bundle (one frame on a connection); larger messages need FRAG, larger frames from a peer cut it off"`
	QueueLen   int        `toml:"bundler_queue" doc:"messages the bundler queue holds before senders block (or drop)"`
	DropFull   bool       `toml:"drop_when_full" doc:"drop and count messages when the bundler queue is full, instead of blocking the sender"`
	MaxQueued  stack.Size `toml:"max_queued_bytes" doc:"received bytes waiting for delivery per sender (regular lane) or per lane (OOB, internal); more are dropped and counted (0: no bound)"`

	SendQueueSize int           `toml:"send_queue_size" doc:"frames queued per peer connection; when full, more are dropped and counted (the reliable layers resend), so one slow or unreachable peer never blocks the others"`
	TCPNoDelay    bool          `toml:"tcp_nodelay" doc:"set TCP_NODELAY (bundling already batches small messages)"`
	KeepAlive     time.Duration `toml:"keep_alive" doc:"TCP keep-alive probe period (0: Go's default, 15s; negative: keep-alive off)"`
	RecvBuf       stack.Size    `toml:"recv_buf_size" doc:"socket receive buffer of each connection (0: the kernel's default, which it grows with the traffic)"`
	SendBuf       stack.Size    `toml:"send_buf_size" doc:"socket send buffer of each connection (0: the kernel's default, which it grows with the traffic)"`
	ConnTimeout   time.Duration `toml:"sock_conn_timeout" doc:"how long a connect to a peer may take"`
	PeerTimeout   time.Duration `toml:"peer_addr_read_timeout" doc:"how long an accepted connection has to send its preamble (and finish TLS); slower ones are closed and counted"`
	MaxPending    int           `toml:"max_pending_connections" doc:"accepted connections still in their preamble at once; more are closed at once and counted (half-open floods)"`
	ConnExpiry    time.Duration `toml:"conn_expiry_timeout" doc:"a connection to an address no view member has, idle this long, is closed (0: never)"`

	CacheExpiry   time.Duration `toml:"logical_addr_cache_expiration" doc:"how long the address of a member no longer in the view is kept"`
	CacheMax      int           `toml:"logical_addr_cache_max_size" doc:"most member addresses kept; beyond it a new one pushes out a non-member's"`
	WhoHasTimeout time.Duration `toml:"who_has_cache_timeout" doc:"least time between two requests to discovery for the same unknown address"`

	TLSEnabled    bool          `toml:"tls" doc:"use TLS on every connection (crypto/tls, TLS 1.3)"`
	TLSCertFile   string        `toml:"tls_cert_file" doc:"PEM certificate (chain) of this member, presented to peers in both directions"`
	TLSKeyFile    string        `toml:"tls_key_file" doc:"PEM private key of tls_cert_file"`
	TLSCAFile     string        `toml:"tls_ca_file" doc:"PEM CA bundle that peers' certificates must chain to"`
	TLSClientAuth bool          `toml:"tls_client_auth" doc:"require and verify a certificate from peers that connect to this member (on by default with TLS)"`
	TLSReload     time.Duration `toml:"tls_reload_interval" doc:"how often the certificate, key and CA files are checked for changes (a rotation needs no restart)"`
	TLSServerName string        `toml:"tls_server_name" doc:"name peers' certificates must carry (empty: any name, the CA decides)"`
}

// MaxDatagram is max_bundle_size, for the loader's check of FRAG's
// frag_size.
func (c *Config) MaxDatagram() stack.Size { return c.BundleSize }

// DefaultConfig returns TCP's defaults.
func DefaultConfig() Config {
	return Config{
		BindAddr: "127.0.0.1", BindPort: 7800, PortRange: 50,
		BundleSize: 64000, QueueLen: 10000, MaxQueued: stack.DefaultMaxQueued,
		SendQueueSize: 2000, TCPNoDelay: true, KeepAlive: 0,
		RecvBuf: 150000, SendBuf: 150000,
		ConnTimeout: 2 * time.Second, PeerTimeout: time.Second, MaxPending: 1000,
		ConnExpiry:  2 * time.Minute,
		CacheExpiry: 360 * time.Second, CacheMax: 2000, WhoHasTimeout: 2 * time.Second,
		TLSClientAuth: true, TLSReload: 5 * time.Second,
	}
}

// maxBundle is the largest max_bundle_size: a peer can make a member
// allocate at most this much per connection before it is cut off.
const maxBundle = 16 << 20

// Validate checks the config, and that bind_addr names an address or
// interface of this machine.
func (c *Config) Validate() error {
	switch {
	case c.BindAddr == "":
		return stack.BadKey("bind_addr", "must not be empty (an address, an interface name, or loopback | site_local | non_loopback)")
	case c.BindPort < 0 || c.BindPort > 65535:
		return stack.BadKey("bind_port", "must be 0..65535, got %d", c.BindPort)
	case c.PortRange < 0 || c.BindPort+c.PortRange > 65535:
		return stack.BadKey("port_range", "must be >= 0 with bind_port+port_range <= 65535, got %d", c.PortRange)
	case c.BundleSize < 1024 || c.BundleSize > maxBundle:
		return stack.BadKey("max_bundle_size", "must be between 1KB and 16MB, got %d", c.BundleSize)
	case c.QueueLen <= 0:
		return stack.BadKey("bundler_queue", "must be > 0, got %d", c.QueueLen)
	case c.MaxQueued != 0 && c.MaxQueued < c.BundleSize:
		return stack.BadKey("max_queued_bytes", "must be 0 (no bound) or at least max_bundle_size (%d), got %d", c.BundleSize, c.MaxQueued)
	case c.SendQueueSize <= 0:
		return stack.BadKey("send_queue_size", "must be > 0, got %d", c.SendQueueSize)
	case c.RecvBuf < 0:
		return stack.BadKey("recv_buf_size", "must be >= 0 (0: the kernel's default, auto-tuned), got %d", c.RecvBuf)
	case c.SendBuf < 0:
		return stack.BadKey("send_buf_size", "must be >= 0 (0: the kernel's default, auto-tuned), got %d", c.SendBuf)
	case c.ConnTimeout <= 0:
		return stack.BadKey("sock_conn_timeout", "must be > 0, got %s", c.ConnTimeout)
	case c.PeerTimeout <= 0:
		return stack.BadKey("peer_addr_read_timeout", "must be > 0, got %s", c.PeerTimeout)
	case c.MaxPending <= 0:
		return stack.BadKey("max_pending_connections", "must be > 0, got %d", c.MaxPending)
	case c.ConnExpiry < 0:
		return stack.BadKey("conn_expiry_timeout", "must be >= 0 (0: never), got %s", c.ConnExpiry)
	case c.CacheExpiry <= 0:
		return stack.BadKey("logical_addr_cache_expiration", "must be > 0, got %s", c.CacheExpiry)
	case c.CacheMax < 2:
		return stack.BadKey("logical_addr_cache_max_size", "must be >= 2, got %d", c.CacheMax)
	case c.WhoHasTimeout <= 0:
		return stack.BadKey("who_has_cache_timeout", "must be > 0, got %s", c.WhoHasTimeout)
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if _, _, err := transport.ResolveBindAddr(c.BindAddr); err != nil {
		return stack.BadKey("bind_addr", "%s", strings.TrimPrefix(err.Error(), "bind_addr "))
	}
	return nil
}

func (c *Config) validateTLS() error {
	if !c.TLSEnabled {
		return nil
	}
	switch {
	case c.TLSCertFile == "":
		return stack.BadKey("tls_cert_file", "must be set when tls = true")
	case c.TLSKeyFile == "":
		return stack.BadKey("tls_key_file", "must be set when tls = true")
	case c.TLSCAFile == "":
		return stack.BadKey("tls_ca_file", "must be set when tls = true (the CA that peers' certificates chain to)")
	case c.TLSReload <= 0:
		return stack.BadKey("tls_reload_interval", "must be > 0, got %s", c.TLSReload)
	}
	if _, err := loadTLSFiles(c.TLSCertFile, c.TLSKeyFile, c.TLSCAFile); err != nil {
		return stack.BadKey(err.key, "%v", err.err)
	}
	return nil
}
