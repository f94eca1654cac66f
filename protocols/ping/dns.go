// DNS_PING: discovery by resolving a DNS name, the way a Kubernetes
// headless Service names the pods behind it. Each discovery
// request resolves the name again (A/AAAA records with the configured
// port, or SRV records with their own ports) and probes every address
// found, as STATIC_PING probes its list; an address whose record is gone
// is no longer probed. Everything else is PING's: it lives in this package
// beside STATIC_PING, as a member of the PING family (no protocol package
// imports another).
package ping

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// DNSConfig configures DNS_PING.
type DNSConfig struct {
	Query        string        `toml:"dns_query" doc:"DNS name to resolve, e.g. the headless Service my-group.my-ns.svc.cluster.local"`
	RecordType   string        `toml:"dns_record_type" doc:"A (A and AAAA records, each probed at port..port+port_range) or SRV (each target at its record's port)"`
	Address      string        `toml:"dns_address" doc:"host:port of the DNS server to ask (empty: the system's resolver)"`
	Port         int           `toml:"port" doc:"port of the members' transport at each A/AAAA address"`
	PortRange    int           `toml:"port_range" doc:"also probe port+1..port+port_range at each A/AAAA address (several members per address)"`
	DNSTimeout   time.Duration `toml:"dns_timeout" doc:"how long one resolution may take"`
	Timeout      time.Duration `toml:"timeout" doc:"how long a discovery round collects answers"`
	BreakOnCoord bool          `toml:"break_on_coord_rsp" doc:"end a discovery round as soon as a coordinator answers"`
	Runs         int           `toml:"num_discovery_runs" doc:"requests sent per round, spread over timeout (each resolves the name again)"`
}

// DefaultDNSConfig returns DNS_PING's defaults.
func DefaultDNSConfig() DNSConfig {
	return DNSConfig{RecordType: "A", Port: 7800, DNSTimeout: time.Second, Timeout: time.Second, BreakOnCoord: true, Runs: 2}
}

// Validate checks the config.
func (c *DNSConfig) Validate() error {
	switch {
	case strings.TrimSpace(c.Query) == "":
		return stack.BadKey("dns_query", "must name the DNS name to resolve")
	case c.RecordType != "A" && c.RecordType != "SRV":
		return stack.BadKey("dns_record_type", "must be A or SRV, got %q", c.RecordType)
	case c.Port <= 0 || c.Port > 65535:
		return stack.BadKey("port", "must be 1..65535, got %d", c.Port)
	case c.PortRange < 0 || c.PortRange > 1000 || c.Port+c.PortRange > 65535:
		return stack.BadKey("port_range", "must be 0..1000 with port+port_range <= 65535, got %d", c.PortRange)
	case c.DNSTimeout <= 0:
		return stack.BadKey("dns_timeout", "must be > 0, got %s", c.DNSTimeout)
	}
	if c.Address != "" {
		if _, err := netip.ParseAddrPort(c.Address); err != nil {
			return stack.BadKey("dns_address", "must be ip:port of a DNS server, got %q", c.Address)
		}
	}
	pc := Config{Timeout: c.Timeout, BreakOnCoord: c.BreakOnCoord, Runs: c.Runs}
	return pc.Validate()
}

func init() {
	stack.Register(stack.ProtocolSpec[DNSConfig]{
		Name: "DNS_PING", ID: stack.IDDNSPing,
		Provides: []stack.Service{stack.ServiceDiscovery},
		Doc:      "discovery by resolving a DNS name (A/AAAA with a port, or SRV) at each round; for Kubernetes headless Services",
		Defaults: DefaultDNSConfig,
		New:      func(c DNSConfig) (stack.Protocol, error) { return NewDNS(c), nil },
	})
}

// DNSPing is the DNS_PING layer: PING's discovery over the addresses a DNS
// name resolves to.
type DNSPing struct {
	*Discovery
	r *resolver
}

var _ stack.Protocol = (*DNSPing)(nil)

// New returns a DNS_PING layer.
func NewDNS(cfg DNSConfig) *DNSPing {
	r := newResolver(cfg)
	d := &DNSPing{r: r}
	d.Discovery = NewResolving("DNS_PING", Config{Timeout: cfg.Timeout, BreakOnCoord: cfg.BreakOnCoord, Runs: cfg.Runs}, r.hosts)
	return d
}

// Init validates the config.
func (d *DNSPing) Init() error {
	if err := d.r.cfg.Validate(); err != nil {
		return err
	}
	return d.Discovery.Init()
}

// Stats reports discovery's counters and the resolver's.
func (d *DNSPing) Stats() []stack.Stat {
	return append(d.Discovery.Stats(), stack.CounterStats(d.r)...)
}

// Hosts returns the addresses the last resolution found.
func (d *DNSPing) Hosts() []netip.AddrPort { return d.r.last() }

// resolver turns the configured name into addresses to probe.
type resolver struct {
	cfg DNSConfig
	res *net.Resolver

	mu   sync.Mutex
	prev []netip.AddrPort

	lookups      atomic.Int64 `stat:"dns_lookups"`
	lookupErrors atomic.Int64 `stat:"dns_lookup_errors"`
	found        atomic.Int64 `stat:"dns_hosts_found"`
}

func newResolver(cfg DNSConfig) *resolver {
	r := &resolver{cfg: cfg, res: net.DefaultResolver}
	if cfg.Address != "" {
		addr := cfg.Address
		r.res = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			// Every query goes to dns_address, whatever /etc/resolv.conf says.
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
	}
	return r
}

// hosts resolves the name now. On an error it returns nothing (a name
// that does not resolve has no members to probe) and counts it.
func (r *resolver) hosts(ctx context.Context) []netip.AddrPort {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DNSTimeout)
	defer cancel()
	r.lookups.Add(1)
	out, err := r.lookup(ctx)
	if err != nil {
		r.lookupErrors.Add(1)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	out = slices.Compact(out)
	r.found.Add(int64(len(out)))
	r.mu.Lock()
	r.prev = out
	r.mu.Unlock()
	return out
}

func (r *resolver) last() []netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.prev)
}

func (r *resolver) lookup(ctx context.Context) ([]netip.AddrPort, error) {
	if r.cfg.RecordType == "SRV" {
		_, srvs, err := r.res.LookupSRV(ctx, "", "", r.cfg.Query)
		if err != nil && len(srvs) == 0 {
			return nil, fmt.Errorf("DNS_PING: SRV %s: %w", r.cfg.Query, err)
		}
		var out []netip.AddrPort
		for _, s := range srvs {
			ips, err := r.res.LookupNetIP(ctx, "ip", s.Target)
			if err != nil {
				continue
			}
			for _, ip := range ips {
				out = append(out, netip.AddrPortFrom(ip.Unmap(), s.Port))
			}
		}
		return out, nil
	}
	ips, err := r.res.LookupNetIP(ctx, "ip", r.cfg.Query)
	if err != nil {
		return nil, fmt.Errorf("DNS_PING: A/AAAA %s: %w", r.cfg.Query, err)
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		for p := r.cfg.Port; p <= r.cfg.Port+r.cfg.PortRange; p++ {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(p)))
		}
	}
	return out, nil
}
