// Package ping is discovery: PING finds the members of a cluster by
// multicast (or, on a transport without IP multicast, by unicast to every
// member the transport knows), STATIC_PING by probing a fixed list of
// host:port addresses. Both learn logical names and physical addresses,
// teach them to the transport, answer the transport's WHO_HAS, and tell
// GMS (EvFindMembers) who is out there and who coordinates.
//
// The two share one package because they share everything but where a
// request is sent (JGroups' Discovery base class and its subclasses).
package ping

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// Config configures PING.
type Config struct {
	Timeout      time.Duration `toml:"timeout" doc:"how long a discovery round collects answers (GMS may ask for another)"`
	BreakOnCoord bool          `toml:"break_on_coord_rsp" doc:"end a discovery round as soon as a coordinator answers"`
	Runs         int           `toml:"num_discovery_runs" doc:"requests sent per round, spread over timeout (more survive loss)"`
	// MaxRankToReply is JGroups' max_rank_to_reply: in a large group a
	// joiner needs the coordinator's answer, not one from every member.
	MaxRankToReply int `toml:"max_rank_to_reply" doc:"in a view, only the members ranked below this answer a discovery request (rank 0: the coordinator); members without a view, and the member a WHO_HAS names, always answer (0: every member answers)"`
}

// DefaultConfig returns PING's defaults.
func DefaultConfig() Config {
	return Config{Timeout: time.Second, BreakOnCoord: true, Runs: 2}
}

// MinControlLimit is the largest discovery message (the sender's MemberInfo
// and a target; answers come one per member, never a list), for the
// loader's check of the transport's largest datagram.
func (c *Config) MinControlLimit() stack.Size {
	return stack.Size(1 + stack.MaxMemberInfoSize + stack.AddressSize)
}

var _ stack.ControlSizer = (*Config)(nil)

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return stack.BadKey("timeout", "must be > 0, got %s", c.Timeout)
	case c.Runs < 1 || c.Runs > 100:
		return stack.BadKey("num_discovery_runs", "must be 1..100, got %d", c.Runs)
	case c.MaxRankToReply < 0:
		return stack.BadKey("max_rank_to_reply", "must be >= 0 (0: every member answers), got %d", c.MaxRankToReply)
	}
	return nil
}

// StaticConfig configures STATIC_PING.
type StaticConfig struct {
	InitialHosts string        `toml:"initial_hosts" doc:"comma-separated host:port (or JGroups' host[port]) of members to probe"`
	PortRange    int           `toml:"port_range" doc:"also probe each port+1..port+port_range"`
	Timeout      time.Duration `toml:"timeout" doc:"how long a discovery round collects answers"`
	BreakOnCoord bool          `toml:"break_on_coord_rsp" doc:"end a discovery round as soon as a coordinator answers"`
	Runs         int           `toml:"num_discovery_runs" doc:"requests sent per round, spread over timeout (more survive loss)"`
	MaxDynamic   int           `toml:"max_dynamic_hosts" doc:"members outside initial_hosts that contacted us, remembered and probed too"`
}

// DefaultStaticConfig returns STATIC_PING's defaults.
func DefaultStaticConfig() StaticConfig {
	return StaticConfig{InitialHosts: "127.0.0.1:7800", PortRange: 1, Timeout: time.Second, BreakOnCoord: true, Runs: 2, MaxDynamic: 2000}
}

// Validate checks the config.
func (c *StaticConfig) Validate() error {
	if _, err := ParseHosts(c.InitialHosts, c.PortRange); err != nil {
		return stack.BadKey("initial_hosts", "%v", err)
	}
	pc := Config{Timeout: c.Timeout, BreakOnCoord: c.BreakOnCoord, Runs: c.Runs}
	if err := pc.Validate(); err != nil {
		return err
	}
	switch {
	case c.PortRange < 0 || c.PortRange > 1000:
		return stack.BadKey("port_range", "must be 0..1000, got %d", c.PortRange)
	case c.MaxDynamic < 0:
		return stack.BadKey("max_dynamic_hosts", "must be >= 0, got %d", c.MaxDynamic)
	}
	return nil
}

// ParseHosts parses "h:p,h:p" (or "h[p],h[p]") into addresses, each port
// expanded by portRange. Hosts must be IP addresses.
func ParseHosts(s string, portRange int) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if i := strings.IndexByte(f, '['); i > 0 && strings.HasSuffix(f, "]") {
			f = f[:i] + ":" + f[i+1:len(f)-1]
		}
		i := strings.LastIndexByte(f, ':')
		if i < 0 {
			return nil, fmt.Errorf("%q: want host:port", f)
		}
		ip, err := netip.ParseAddr(strings.Trim(f[:i], "[]"))
		if err != nil {
			return nil, fmt.Errorf("%q: host must be an IP address", f)
		}
		port, err := strconv.ParseUint(f[i+1:], 10, 16)
		if err != nil || port == 0 {
			return nil, fmt.Errorf("%q: bad port", f)
		}
		for p := int(port); p <= int(port)+portRange && p <= 65535; p++ {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(p)))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no hosts given")
	}
	return out, nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "PING", ID: stack.IDPING,
		Provides: []stack.Service{stack.ServiceDiscovery},
		Doc:      "discovery by multicast: finds members and their coordinator, fills the transport's address cache",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.Register(stack.ProtocolSpec[StaticConfig]{
		Name: "STATIC_PING", ID: stack.IDStaticPING,
		Provides: []stack.Service{stack.ServiceDiscovery},
		Doc:      "discovery by probing a fixed list of host:port (no IP multicast needed); learns members that contact it",
		Defaults: DefaultStaticConfig,
		New:      func(c StaticConfig) (stack.Protocol, error) { return NewStatic(c), nil },
	})
	// DNS_PING (dns.go) is this layer with resolved hosts: same header.
	for _, id := range []uint16{stack.IDPING, stack.IDStaticPING, stack.IDDNSPing} {
		stack.RegisterHeader(stack.HeaderType{ID: id, Name: "PING", Decode: decodeHeader, Samples: sampleHeaders})
	}
}

// Discovery is PING or STATIC_PING.
type Discovery struct {
	stack.Base
	name   string
	cfg    Config
	static []netip.AddrPort // STATIC_PING's probe list; nil for PING
	maxDyn int
	// resolve, if set, gives the hosts to probe at each request instead of
	// static (DNS_PING).
	resolve func(context.Context) []netip.AddrPort

	mu      sync.Mutex
	rounds  map[*round]struct{}
	dynamic map[netip.AddrPort]struct{} // STATIC_PING: hosts that contacted us

	reqSent     atomic.Int64 `stat:"requests_sent"`
	reqRecv     atomic.Int64 `stat:"requests_received"`
	rspSent     atomic.Int64 `stat:"responses_sent"`
	rspSkipped  atomic.Int64 `stat:"requests_left_to_lower_ranks"`
	rspRecv     atomic.Int64 `stat:"responses_received"`
	whoHas      atomic.Int64 `stat:"who_has_requests"`
	sendErrors  atomic.Int64 `stat:"send_errors"`
	misdirected atomic.Int64 `stat:"physical_address_overridden"`
}

var _ stack.Protocol = (*Discovery)(nil)

type round struct {
	mu    sync.Mutex
	found map[stack.Address]stack.MemberInfo
	coord chan struct{} // closed when a coordinator answered
	seen  bool
}

// New returns a PING layer.
func New(cfg Config) *Discovery { return &Discovery{name: "PING", cfg: cfg} }

// NewStatic returns a STATIC_PING layer.
func NewStatic(c StaticConfig) *Discovery {
	hosts, _ := ParseHosts(c.InitialHosts, c.PortRange)
	return &Discovery{name: "STATIC_PING", static: hosts, maxDyn: c.MaxDynamic,
		cfg: Config{Timeout: c.Timeout, BreakOnCoord: c.BreakOnCoord, Runs: c.Runs}}
}

// NewResolving returns a discovery layer named name that probes the
// addresses resolve returns, asked again at every request (DNS_PING
// resolving a name): an address that is no longer returned is no longer
// probed. Members that contact it are not remembered beyond what resolve
// returns.
func NewResolving(name string, cfg Config, resolve func(context.Context) []netip.AddrPort) *Discovery {
	return &Discovery{name: name, cfg: cfg, resolve: resolve}
}

// Name returns "PING" or "STATIC_PING".
func (d *Discovery) Name() string { return d.name }

// Init validates the config.
func (d *Discovery) Init() error {
	if d.name == "STATIC_PING" && len(d.static) == 0 {
		return stack.BadKey("initial_hosts", "no hosts given")
	}
	return d.cfg.Validate()
}

// Start clears what an earlier connection learnt.
func (d *Discovery) Start() error {
	d.mu.Lock()
	d.rounds = map[*round]struct{}{}
	d.dynamic = map[netip.AddrPort]struct{}{}
	d.mu.Unlock()
	return nil
}

func (d *Discovery) self() stack.MemberInfo {
	local := d.LocalAddress()
	mi := stack.MemberInfo{Addr: local}
	mi.Name, _ = stack.LogicalName(local)
	mi.Physical, _ = stack.Ask(d.Context(), d, stack.EvGetLocalPhysicalAddress{})
	if v := d.View(); v != nil {
		mi.IsServer, mi.Coord = true, v.Coordinator()
	}
	return mi
}

// FindMembers runs one discovery round: it sends requests and collects
// answers, and the requests of members without a view (they are joining
// too), until the timeout (or the first coordinator's answer, with
// breakOnCoord), or until ctx ends. It never includes the local member.
func (d *Discovery) FindMembers(ctx context.Context, timeout time.Duration, breakOnCoord bool) []stack.MemberInfo {
	if timeout <= 0 {
		timeout = d.cfg.Timeout
	}
	r := &round{found: map[stack.Address]stack.MemberInfo{}, coord: make(chan struct{})}
	d.mu.Lock()
	d.rounds[r] = struct{}{}
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.rounds, r)
		d.mu.Unlock()
	}()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	every := time.NewTicker(timeout / time.Duration(d.cfg.Runs+1))
	defer every.Stop()
	coord := r.coord
	if !breakOnCoord {
		coord = nil
	}
	d.sendRequest(stack.Address{})
	for sent := 1; ; {
		select {
		case <-ctx.Done():
		case <-d.Done():
		case <-deadline.C:
		case <-coord:
		case <-every.C:
			if sent < d.cfg.Runs {
				sent++
				d.sendRequest(stack.Address{})
			}
			continue
		}
		break
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]stack.MemberInfo, 0, len(r.found))
	for _, mi := range r.found {
		out = append(out, mi)
	}
	return out
}

// sendRequest multicasts a discovery request (STATIC_PING: sends it to every
// probed host). A non-zero target asks only that member to answer.
func (d *Discovery) sendRequest(target stack.Address) {
	h := &Header{Type: typeRequest, Info: d.self(), Target: target}
	if d.static == nil && d.resolve == nil {
		d.reqSent.Add(1)
		d.send(stack.Address{}, h)
		return
	}
	hosts := append([]netip.AddrPort(nil), d.static...)
	if d.resolve != nil {
		hosts = d.resolve(d.Context())
	}
	d.mu.Lock()
	for ap := range d.dynamic {
		hosts = append(hosts, ap)
	}
	d.mu.Unlock()
	for _, ap := range hosts {
		if ap == h.Info.Physical {
			continue
		}
		d.reqSent.Add(1)
		_, err := d.PassDownEvent(d.Context(), stack.EvSendToPhysical{To: ap, Msg: d.message(stack.Address{}, h)})
		if err != nil {
			d.sendErrors.Add(1)
			if errors.Is(err, stack.ErrNotSupported) {
				d.Log().Warn("STATIC_PING needs a transport with network addresses", "error", err)
				return
			}
		}
	}
}

func (d *Discovery) message(dest stack.Address, h *Header) *stack.Message {
	m := stack.NewMessage(dest, nil).Set(stack.Internal | stack.OOB | stack.DontBundle | stack.NoReliability)
	m.PutHeader(d.ID(), h)
	return m
}

func (d *Discovery) send(dest stack.Address, h *Header) {
	if err := d.PassDown(d.Context(), d.message(dest, h)); err != nil {
		d.sendErrors.Add(1)
	}
}

// Up handles discovery requests and answers; other messages pass.
func (d *Discovery) Up(m *stack.Message) {
	h, ok := m.Header(d.ID()).(*Header)
	if !ok {
		d.PassUp(m)
		return
	}
	d.handle(m, h)
}

// handle takes a request or an answer. The sender is where its datagram
// came from (m.From), whatever physical address its body names: answers go
// back to the asker, never to an address a request chose (a reflection
// vector), and no one can point a member's address elsewhere.
func (d *Discovery) handle(m *stack.Message, h *Header) {
	src := m.Src
	if src.IsZero() || src == d.LocalAddress() || h.Info.Addr != src {
		return
	}
	mi := h.Info
	if m.From.IsValid() {
		if mi.Physical.IsValid() && mi.Physical != m.From {
			d.misdirected.Add(1)
		}
		mi.Physical = m.From
	}
	d.learn(mi)
	switch h.Type {
	case typeRequest:
		d.reqRecv.Add(1)
		if !mi.IsServer {
			// A member that asks without a view is joining too: it counts
			// in this member's rounds as its answer would. Without it, a
			// member that started first and heard no answer starts a
			// group, while one that started during its round hears it
			// (no view yet), finds its own address the lower and starts
			// another: two groups until MERGE3 joins them (half the time,
			// for two members started half a round apart).
			d.addToRounds(mi)
		}
		if !h.Target.IsZero() && h.Target != d.LocalAddress() {
			return
		}
		if h.Target.IsZero() && !d.answers() {
			d.rspSkipped.Add(1)
			return
		}
		d.rspSent.Add(1)
		d.send(src, &Header{Type: typeResponse, Info: d.self()})
	case typeResponse:
		d.rspRecv.Add(1)
		d.addToRounds(mi)
	}
}

// addToRounds records mi in every discovery round under way.
func (d *Discovery) addToRounds(mi stack.MemberInfo) {
	d.mu.Lock()
	for r := range d.rounds {
		r.add(mi)
	}
	d.mu.Unlock()
}

// answers reports whether this member answers a request to all: with
// max_rank_to_reply, a member of a view only if its rank in the view is
// below it, so that a joiner of a large group gets a few answers, the
// coordinator's first among them, instead of one from every member.
func (d *Discovery) answers() bool {
	if d.cfg.MaxRankToReply <= 0 {
		return true
	}
	v := d.View()
	if v == nil {
		return true // joining: members that start at once must find each other
	}
	rank := v.Index(d.LocalAddress())
	return rank < 0 || rank < d.cfg.MaxRankToReply
}

func (r *round) add(mi stack.MemberInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.found[mi.Addr]; ok && old.IsServer && !mi.IsServer {
		return // a late request from before its view: the answer stands
	}
	r.found[mi.Addr] = mi
	if mi.IsCoord() && !r.seen {
		r.seen = true
		close(r.coord)
	}
}

// learn records a member's name and teaches the transport its address.
func (d *Discovery) learn(mi stack.MemberInfo) {
	if mi.Name != "" {
		if old, ok := stack.LogicalName(mi.Addr); !ok || old != mi.Name {
			stack.SetLogicalName(mi.Addr, mi.Name)
		}
	}
	if !mi.Physical.IsValid() {
		return
	}
	_, _ = d.PassDownEvent(d.Context(), stack.EvAddPhysicalAddress{Logical: mi.Addr, Physical: mi.Physical})
	if d.static == nil {
		return
	}
	d.mu.Lock()
	if _, ok := d.dynamic[mi.Physical]; !ok && len(d.dynamic) < d.maxDyn && !containsAddrPort(d.static, mi.Physical) {
		d.dynamic[mi.Physical] = struct{}{}
	}
	d.mu.Unlock()
}

func containsAddrPort(s []netip.AddrPort, a netip.AddrPort) bool {
	for _, x := range s {
		if x == a {
			return true
		}
	}
	return false
}

// UpEvent answers the transport's WHO_HAS with a targeted request.
func (d *Discovery) UpEvent(ev stack.Event) (stack.Answer, error) {
	if e, ok := ev.(stack.EvWhoHas); ok {
		if !e.Member.IsZero() {
			d.whoHas.Add(1)
			d.sendRequest(e.Member)
		}
		return stack.Answer{}, nil
	}
	return d.PassUpEvent(ev)
}

// DownEvent runs discovery rounds.
func (d *Discovery) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if e, ok := ev.(stack.EvFindMembers); ok {
		return stack.Reply(e, d.FindMembers(ctx, e.Timeout, e.BreakOnCoord && d.cfg.BreakOnCoord)), nil
	}
	return d.PassDownEvent(ctx, ev)
}

// Stats reports discovery's counters.
func (d *Discovery) Stats() []stack.Stat {
	d.mu.Lock()
	ndyn := len(d.dynamic)
	d.mu.Unlock()
	return append(stack.CounterStats(d),
		stack.Stat{Name: "dynamic_hosts", Value: int64(ndyn)},
	)
}
