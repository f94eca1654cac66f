package stack

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
)

// DiagServer is a channel's diagnostics endpoint (metrics, a JSON snapshot,
// pprof over HTTP): New starts it when the channel has a diagnostics
// address, and Close stops it and waits for its goroutines.
type DiagServer interface {
	Addr() net.Addr
	Close() error
}

// DiagStarter starts the diagnostics endpoint of ch, listening on addr.
type DiagStarter func(ch *Channel, addr string) (DiagServer, error)

var (
	diagMu      sync.Mutex
	diagStarter DiagStarter
)

// RegisterDiag sets what serves a channel's diagnostics; package diag
// registers it in its init (as database/sql drivers do), so that the core
// needs no HTTP or Prometheus code. A second registration panics.
func RegisterDiag(f DiagStarter) {
	diagMu.Lock()
	defer diagMu.Unlock()
	if f == nil || diagStarter != nil {
		panic("stack: RegisterDiag called twice or with nil")
	}
	diagStarter = f
}

// WithDiag serves the channel's diagnostics on addr (host:port, "127.0.0.1:0"
// for a free port) from New until Close, overriding the config's diag_addr;
// "" turns them off. The program must import package diag.
func WithDiag(addr string) Option {
	return func(o *options) { o.diag = &addr }
}

// CheckDiagAddr checks a diagnostics address: host:port with the host
// named (an IP address or a host name; 0.0.0.0 for every interface) and
// not a multicast address, since the endpoint never answers a group.
func CheckDiagAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port such as \"127.0.0.1:7900\", got %q", addr)
	}
	if host == "" {
		return fmt.Errorf("%q names no host: name the address to listen on, such as \"127.0.0.1%s\" (\"0.0.0.0%s\" listens on every interface)", addr, addr, addr)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || (p == 0 && port != "0") {
		return fmt.Errorf("port %q of %q must be a number 0..65535 (0: any free port)", port, addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsMulticast() {
		return fmt.Errorf("%s is a multicast address; diagnostics are served over TCP to one asker, never to a group", host)
	}
	return nil
}

// startDiag starts ch's diagnostics endpoint on addr, if addr is set.
func (c *Channel) startDiag(addr string) error {
	if addr == "" {
		return nil
	}
	if err := CheckDiagAddr(addr); err != nil {
		return fmt.Errorf("strata: diag_addr: %w", err)
	}
	diagMu.Lock()
	start := diagStarter
	diagMu.Unlock()
	if start == nil {
		return fmt.Errorf("strata: diag_addr %s: no diagnostics server in the program; import _ \"github.com/strata-go/strata/diag\"", addr)
	}
	srv, err := start(c, addr)
	if err != nil {
		return fmt.Errorf("strata: diag_addr %s: %w", addr, err)
	}
	c.diag = srv
	return nil
}

// DiagAddr returns the address the channel's diagnostics endpoint listens
// on, or nil when it has none (diag_addr empty, the default).
func (c *Channel) DiagAddr() net.Addr {
	if c.diag == nil {
		return nil
	}
	return c.diag.Addr()
}

// closeDiag stops the diagnostics endpoint; Close calls it once.
func (c *Channel) closeDiag() error {
	if c.diag == nil {
		return nil
	}
	return c.diag.Close()
}
