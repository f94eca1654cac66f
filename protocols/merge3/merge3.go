// Package merge3 is MERGE3: it finds the subgroups a partition left behind.
// Every member announces its view id and coordinator now and then (at a
// random time between min_interval and max_interval); every check_interval a
// coordinator looks at the announcements it heard, and if they name other
// coordinators and it has the lowest address of them all (the merge leader,
// chosen the same way by everyone), it passes EvMerge up to GMS, which
// merges the subgroups.
package merge3

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures MERGE3.
type Config struct {
	MinInterval   time.Duration `toml:"min_interval" doc:"least time between two announcements of this member"`
	MaxInterval   time.Duration `toml:"max_interval" doc:"most time between two announcements of this member"`
	CheckInterval time.Duration `toml:"check_interval" doc:"how often a coordinator looks for other subgroups (0: 1.6 x max_interval)"`
}

// DefaultConfig returns the intervals of JGroups' udp.xml.
func DefaultConfig() Config {
	return Config{MinInterval: 10 * time.Second, MaxInterval: 30 * time.Second}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.MinInterval <= 0:
		return stack.BadKey("min_interval", "must be > 0, got %s", c.MinInterval)
	case c.MaxInterval < c.MinInterval:
		return stack.BadKey("max_interval", "(%s) must be >= min_interval (%s)", c.MaxInterval, c.MinInterval)
	case c.CheckInterval < 0:
		return stack.BadKey("check_interval", "must be >= 0, got %s", c.CheckInterval)
	case c.CheckInterval > 0 && c.CheckInterval <= c.MaxInterval:
		return stack.BadKey("check_interval", "(%s) must be greater than max_interval (%s), or a check can miss a subgroup's announcements", c.CheckInterval, c.MaxInterval)
	}
	return nil
}

// MinControlLimit is the largest MERGE3 message (an announcement: a view
// id and a MemberInfo; no member list), for the loader's check of the
// transport's largest datagram.
func (c *Config) MinControlLimit() stack.Size {
	return stack.Size(stack.AddressSize + 10 + stack.MaxMemberInfoSize)
}

var _ stack.ControlSizer = (*Config)(nil)

func (c Config) check() time.Duration {
	if c.CheckInterval > 0 {
		return c.CheckInterval
	}
	return c.MaxInterval * 16 / 10
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "MERGE3", ID: stack.IDMERGE3,
		RequiresAbove: []stack.Service{stack.ServiceMembership},
		Doc:           "finds subgroups after a partition heals (announced view ids) and has GMS merge them",
		Defaults:      DefaultConfig,
		New:           func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDMERGE3, Name: "MERGE3", Decode: decodeHeader,
		Samples: func() []stack.Header {
			a := stack.NewAddress()
			return []stack.Header{
				&Header{ViewID: stack.ViewID{Creator: a, Seq: 9}, Info: stack.MemberInfo{Addr: a, Name: "A", Physical: netip.MustParseAddrPort("127.0.0.1:7800"), IsServer: true, Coord: a}},
				&Header{Info: stack.MemberInfo{Addr: a}},
			}
		},
	})
}

// Header is an announcement: the sender's view id, coordinator, name and
// physical address.
type Header struct {
	ViewID stack.ViewID
	Info   stack.MemberInfo
}

// Size returns the encoded length.
func (h *Header) Size() int {
	return stack.ViewIDSize(h.ViewID) + stack.MemberInfoSize(h.Info)
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = stack.AppendViewID(b, h.ViewID)
	return stack.AppendMemberInfo(b, h.Info)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{ViewID: stack.ReadViewID(r)}
	h.Info = stack.ReadMemberInfo(r)
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// Merge3 is the MERGE3 protocol.
type Merge3 struct {
	stack.Base
	cfg Config

	mu    sync.Mutex
	heard map[stack.Address]*Header // announcements since the last check

	sent         atomic.Int64 `stat:"announcements_sent"`
	received     atomic.Int64 `stat:"announcements_received"`
	merges       atomic.Int64 `stat:"merges_started"`
	told         atomic.Int64 `stat:"leaders_told"`
	inconsistent atomic.Int64 `stat:"views_inconsistent"`
}

var _ stack.Protocol = (*Merge3)(nil)

// New returns a MERGE3 layer.
func New(cfg Config) *Merge3 { return &Merge3{cfg: cfg, heard: map[stack.Address]*Header{}} }

// Name returns "MERGE3".
func (m *Merge3) Name() string { return "MERGE3" }

// Init validates the config.
func (m *Merge3) Init() error { return m.cfg.Validate() }

// Start starts announcing and checking.
func (m *Merge3) Start() error {
	m.mu.Lock()
	clear(m.heard)
	m.mu.Unlock()
	m.Go(func(done <-chan struct{}) {
		for {
			d := m.cfg.MinInterval
			if span := m.cfg.MaxInterval - m.cfg.MinInterval; span > 0 {
				d += m.Rand().Duration(span)
			}
			t := time.NewTimer(d)
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
				m.Announce()
			}
		}
	})
	m.GoEvery(m.cfg.check(), m.Check)
	return nil
}

func (m *Merge3) self() *Header {
	v := m.View()
	if v == nil {
		return nil
	}
	local := m.LocalAddress()
	h := &Header{ViewID: v.ID, Info: stack.MemberInfo{Addr: local, IsServer: true, Coord: v.Coordinator()}}
	h.Info.Name, _ = stack.LogicalName(local)
	h.Info.Physical, _ = stack.Ask(m.Context(), m, stack.EvGetLocalPhysicalAddress{})
	return h
}

// Announce multicasts this member's view id now, and sends it to every
// member the transport knows outside the view (for transports without IP
// multicast, whose group messages reach only the view).
func (m *Merge3) Announce() {
	h := m.self()
	if h == nil {
		return
	}
	m.sendInfo(stack.Address{}, h)
	as, _ := stack.Ask(m.Context(), m, stack.EvKnownMembers{})
	v := m.View()
	for _, a := range as {
		if !v.Contains(a) {
			m.sendInfo(a, h)
		}
	}
}

func (m *Merge3) sendInfo(dest stack.Address, h *Header) {
	msg := stack.NewMessage(dest, nil).Set(stack.Internal | stack.OOB | stack.NoReliability)
	msg.PutHeader(m.ID(), h)
	m.sent.Add(1)
	_ = m.PassDown(m.Context(), msg)
}

// Check looks at the announcements heard since the last check; a
// coordinator that heard of other coordinators and has the lowest address
// of them passes EvMerge up.
func (m *Merge3) Check() {
	self := m.LocalAddress()
	v := m.View()
	m.mu.Lock()
	heard := m.heard
	m.heard = map[stack.Address]*Header{}
	m.mu.Unlock()
	if v == nil || v.Coordinator() != self {
		return
	}
	coords := []stack.Address{self}
	// Members outside this view whose view names a coordinator that is in
	// this one (it moved on without them: a merge or view change left them
	// out and they missed it) or that was not heard since the last check
	// (it crashed or left): nobody may coordinate what is left of their
	// view. They are asked directly: the first of them in their view's
	// order that it does not suspect answers for the rest (GMS,
	// onMergeReq), as JGroups' MERGE3 sanitizes views. They do not lead a
	// merge: they run no check. Their coordinator, not heard, is asked too
	// (unheard): under loss its announcements of a whole check interval
	// can all be lost while it is alive, and then its members refuse to
	// answer for it and the merge would fail (a whole check_interval lost
	// on a cold start under 20% loss). It does not take part in choosing
	// the leader: if it did crash, nobody would lead.
	var orphans, unheard []stack.Address
	var inc stack.EvViewInconsistent
	for src, h := range heard {
		if v.Contains(src) && h.ViewID != v.ID {
			// A member of this view with another view id: not another
			// subgroup. It missed a view (the last one a leaving
			// coordinator sent, say, which nobody would send again), or it
			// installed one this coordinator never saw (a view of the same
			// number from a coordinator that left). GMS mends either.
			if h.ViewID.Seq < v.ID.Seq {
				inc.Behind = append(inc.Behind, src)
			} else {
				inc.Above = max(inc.Above, h.ViewID.Seq)
			}
			continue
		}
		c := h.Info.Coord
		if c.IsZero() {
			c = src
		}
		if !v.Contains(src) && c != src && (v.Contains(c) || heard[c] == nil) {
			orphans = append(orphans, src)
			if !v.Contains(c) && !slices.Contains(unheard, c) {
				unheard = append(unheard, c)
			}
			continue
		}
		if (!v.Contains(src) || !v.Contains(c)) && !slices.Contains(coords, c) {
			coords = append(coords, c)
		}
	}
	if len(inc.Behind) > 0 || inc.Above > 0 {
		m.inconsistent.Add(1)
		m.Log().Info("members of the view announce another view id", "behind", inc.Behind, "above", inc.Above, "view", v.ID)
		_, _ = m.PassUpEvent(inc)
	}
	if len(coords)+len(orphans) < 2 {
		return
	}
	if leader := slices.MinFunc(coords, stack.Address.Compare); leader != self {
		// That coordinator leads the merge. It may not have heard this
		// subgroup (a subgroup of one has no members to name it, and under
		// loss all of its announcements of a check interval can be lost),
		// so it is told directly, once per check: otherwise the merge can
		// wait check intervals more.
		if h := m.self(); h != nil {
			m.told.Add(1)
			m.sendInfo(leader, h)
		}
		return
	}
	slices.SortFunc(orphans, stack.Address.Compare)
	slices.SortFunc(unheard, stack.Address.Compare)
	m.merges.Add(1)
	m.Log().Info("other subgroups found; merging", "coordinators", coords, "unheard", unheard, "left_out", orphans)
	_, _ = m.PassUpEvent(stack.EvMerge{Coords: slices.Concat(coords, unheard, orphans)})
}

// handle takes an announcement. Where the transport knows where the
// datagram came from (from), that is the sender's physical address, not
// the one its body names.
func (m *Merge3) handle(src stack.Address, from netip.AddrPort, h *Header) {
	if src == m.LocalAddress() || h.Info.Addr != src {
		return
	}
	phys := h.Info.Physical
	if from.IsValid() {
		phys = from
	}
	m.received.Add(1)
	if h.Info.Name != "" {
		if old, ok := stack.LogicalName(src); !ok || old != h.Info.Name {
			stack.SetLogicalName(src, h.Info.Name)
		}
	}
	if phys.IsValid() {
		_, _ = m.PassDownEvent(m.Context(), stack.EvAddPhysicalAddress{Logical: src, Physical: phys})
	}
	// Only what Check acts on is kept: an announcement of this member's
	// own view comes from a member of it, which Check passes by. In a
	// steady group of N that is every announcement, and keeping them
	// would cost every member N of them.
	v := m.View()
	m.mu.Lock()
	if v != nil && h.ViewID == v.ID {
		delete(m.heard, src) // superseded: its view is this one now
	} else {
		m.heard[src] = h
	}
	m.mu.Unlock()
}

// Up takes announcements; other messages pass.
func (m *Merge3) Up(msg *stack.Message) {
	if h, ok := msg.Header(m.ID()).(*Header); ok {
		m.handle(msg.Src, msg.From, h)
		return
	}
	m.PassUp(msg)
}

// Stats reports MERGE3's counters.
func (m *Merge3) Stats() []stack.Stat {
	return stack.CounterStats(m)
}
