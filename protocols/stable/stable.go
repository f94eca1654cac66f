// Package stable is STABLE: the coordinator collects from every member the
// highest seqno it has delivered from each sender and announces the minimum;
// once every member of the view has delivered a seqno, the reliable-multicast
// layer below purges it. It bounds the memory NAKACK holds for
// retransmission to what is not yet stable.
//
// As in JGroups' STABLE, members send their digests (votes) to the
// coordinator only, which multicasts the result (STABILITY): a round costs
// N-1 unicasts and one multicast, and each member handles one message, not
// N digests of N entries. A vote carries only the entries that changed
// since this member's last vote to the same coordinator; votes are
// reliable unicasts, so none is lost while the coordinator lives, and
// every wholeVoteEvery votes one is whole anyway. Announcements are
// unreliable multicasts that carry what changed, and everything every
// wholeEvery rounds: a lost one costs a later purge, never a wrong one.
// Votes and announcements go in parts of at most maxEntries entries, so
// neither has to fit one datagram however large the view.
//
// Votes and announcements are small: an entry names its sender by its
// place in the view (both ends hold the view the message names) and
// carries one seqno, a few bytes instead of an address and two seqnos.
// A member votes once per round: after a timed vote it waits for the
// round's announcement before its next one (or backstop intervals, should
// the announcement be lost or the round have nothing to purge), since a
// round completes only when every member has voted, and more votes in
// between would only be overwritten.
package stable

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures STABLE.
type Config struct {
	Interval time.Duration `toml:"desired_avg_gossip" doc:"average time between two votes of this member (its digest, to the coordinator; randomised by ±50%)"`
	MaxBytes stack.Size    `toml:"max_bytes" doc:"bytes of multicasts received after which a vote is sent at once"`
}

// DefaultConfig returns STABLE's defaults.
func DefaultConfig() Config { return Config{Interval: 20 * time.Second, MaxBytes: 4_000_000} }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return stack.BadKey("desired_avg_gossip", "must be > 0, got %s", c.Interval)
	case c.MaxBytes <= 0:
		return stack.BadKey("max_bytes", "must be > 0, got %d", c.MaxBytes)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "STABLE", ID: stack.IDSTABLE,
		Requires: []stack.Service{stack.ServiceReliableMulticast},
		Doc:      "the coordinator collects delivered seqnos and announces what every member has delivered; NAKACK purges it",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDSTABLE, Name: "STABLE", Decode: decodeHeader,
		Samples: func() []stack.Header {
			a, b := stack.NewAddress(), stack.NewAddress()
			return []stack.Header{
				&Header{Type: TypeVote, ViewID: stack.ViewID{Creator: a, Seq: 3}, Entries: []Entry{{Index: 0, Seqno: 10}, {Index: 7, Seqno: 1 << 40}}},
				&Header{Type: TypeVote, Last: true, Entries: []Entry{}},
				&Header{Type: TypeStability, ViewID: stack.ViewID{Creator: b, Seq: 1}, Entries: []Entry{{Index: 3, Seqno: 7}}, Last: true},
			}
		},
	})
}

// maxEntries bounds the entries of one STABLE message (at most 13 bytes
// each): larger votes and announcements go in parts. A transport with
// small datagrams makes the parts smaller (perPart).
var maxEntries = 1000

// maxEntrySize is the largest encoding of one entry: a place in the view
// (below 1<<16: 3 bytes) and a seqno (10).
const maxEntrySize = 3 + 10

// maxIndex bounds the places in a view that an entry may name.
const maxIndex = 1 << 16

// headerFixed bounds a STABLE header without its digest entries: type,
// last, view id and the entry count.
const headerFixed = 2 + stack.AddressSize + 10 + 5

// minControlLimit is the smallest stack.ControlLimit STABLE works with: a
// part of one entry.
const minControlLimit = headerFixed + maxEntrySize

// MinControlLimit is the smallest stack.ControlLimit STABLE works with, for
// the loader's check of the transport's largest datagram.
func (c *Config) MinControlLimit() stack.Size { return minControlLimit }

var _ stack.ControlSizer = (*Config)(nil)

// perPart is how many digest entries one STABLE message carries: at most
// maxEntries, and what fits the stack's ControlLimit.
func (s *STABLE) perPart() int {
	return max(1, min(maxEntries, (s.Stack().ControlLimit()-headerFixed)/maxEntrySize))
}

// wholeEvery is how often, in rounds, the coordinator announces every
// sender's stable seqno rather than only those that changed.
const wholeEvery = 10

// wholeVoteEvery is how often, in votes, a member sends its whole digest
// though its votes are reliable: a backstop, should one be lost anyway
// (a connection closed under it). Whole votes cost N entries from each of
// N members, so they must be rare in a large group.
const wholeVoteEvery = 100

// The types of STABLE messages.
const (
	// TypeVote is a member's digest (or part of it), sent to the coordinator.
	TypeVote byte = 1
	// TypeStability is the coordinator's announcement (or part of it) of
	// what every member has delivered, multicast.
	TypeStability byte = 2
)

// Header is a STABLE message: a vote or a stability announcement, for the
// view ViewID. Last marks the last part of a member's vote.
type Header struct {
	Type    byte
	Last    bool
	ViewID  stack.ViewID
	Entries []Entry // in increasing order of Index
}

// Entry is one sender's highest delivered seqno (in a vote: delivered by
// the voter; in an announcement: by every member), the sender named by
// its place in the view the message names.
type Entry struct {
	Index uint32
	Seqno uint64
}

// Size returns the encoded length.
func (h *Header) Size() int {
	n := 2 + stack.ViewIDSize(h.ViewID) + wire.UvarintSize(uint64(len(h.Entries)))
	prev := uint32(0)
	for _, e := range h.Entries {
		n += wire.UvarintSize(uint64(e.Index-prev)) + wire.UvarintSize(e.Seqno)
		prev = e.Index
	}
	return n
}

// AppendTo appends the encoding: the entries' places as gaps from the
// previous one.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, h.Type)
	b = wire.AppendBool(b, h.Last)
	b = stack.AppendViewID(b, h.ViewID)
	b = wire.AppendUvarint(b, uint64(len(h.Entries)))
	prev := uint32(0)
	for _, e := range h.Entries {
		b = wire.AppendUvarint(b, uint64(e.Index-prev))
		b = wire.AppendUvarint(b, e.Seqno)
		prev = e.Index
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8(), Last: r.Bool(), ViewID: stack.ReadViewID(r)}
	n := r.Uvarint()
	if n > maxIndex || 2*n > uint64(r.Len()) {
		r.Fail("stable: %d entries", n)
		return nil, r.Err()
	}
	h.Entries = make([]Entry, n)
	prev := uint64(0)
	for i := range h.Entries {
		d := r.Uvarint()
		if i > 0 && d == 0 || prev+d >= maxIndex {
			r.Fail("stable: entry places must increase and stay below %d", maxIndex)
			return nil, r.Err()
		}
		prev += d
		h.Entries[i] = Entry{Index: uint32(prev), Seqno: r.Uvarint()}
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	if h.Type != TypeVote && h.Type != TypeStability {
		r.Fail("stable: unknown message type %d", h.Type)
		return nil, r.Err()
	}
	return h, nil
}

// entries returns d's entries (delivered seqnos) by their senders' places
// in v, in increasing order; senders not in v are left out.
func entries(v *stack.View, d stack.Digest) []Entry {
	out := make([]Entry, 0, len(d))
	if len(d) > 8 {
		pos := make(map[stack.Address]int, v.Size())
		for i, m := range v.Members {
			pos[m] = i
		}
		for _, e := range d {
			if i, ok := pos[e.Member]; ok {
				out = append(out, Entry{Index: uint32(i), Seqno: e.HighestDelivered})
			}
		}
	} else {
		for _, e := range d {
			if i := v.Index(e.Member); i >= 0 {
				out = append(out, Entry{Index: uint32(i), Seqno: e.HighestDelivered})
			}
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// Digest returns the entries as a digest of the members of v, the view
// the message names; ok is false if an entry names no member of it.
func (h *Header) Digest(v *stack.View) (d stack.Digest, ok bool) {
	d = make(stack.Digest, 0, len(h.Entries))
	for _, e := range h.Entries {
		if int(e.Index) >= v.Size() {
			return nil, false
		}
		d = append(d, stack.DigestEntry{Member: v.Members[e.Index], HighestDelivered: e.Seqno})
	}
	return d, true
}

// STABLE is the STABLE protocol.
type STABLE struct {
	stack.Base
	cfg Config

	mu    sync.Mutex
	view  *stack.View
	bytes int64
	// As a member: the highest delivered seqno per sender in this
	// member's last vote of this view (nil until a whole vote went out),
	// and votes since the last whole one.
	voted     map[stack.Address]uint64
	sinceVote int
	// As a member: a timed vote went out at votedAt and the round's
	// announcement has not come since; the next timed vote waits for it,
	// or for backstop intervals.
	waiting bool
	votedAt time.Time
	// As the coordinator: per member, the highest delivered seqno per
	// sender heard in its votes of this view; who voted this round; and
	// who counts as voted in it by its row (ahead; see takeVote).
	rows  map[stack.Address]map[stack.Address]uint64
	round map[stack.Address]bool
	ahead map[stack.Address]bool
	// As the coordinator: what it announced per sender in this view, and
	// rounds since the last whole announcement.
	told     map[stack.Address]uint64
	sinceAll int
	// kick makes the vote loop vote now: a member new to the view or to
	// its coordinator votes at once, so that rounds, which wait for every
	// member, are not held up by the newest joiner.
	kick chan struct{}

	sent      atomic.Int64 `stat:"gossips_sent"`
	received  atomic.Int64 `stat:"gossips_received"`
	rounds    atomic.Int64 `stat:"stable_rounds"`
	announced atomic.Int64 `stat:"stability_received"`
	stale     atomic.Int64 `stat:"gossips_ignored"`
	skipped   atomic.Int64 `stat:"votes_skipped"` // timed votes not sent: the round had not ended
}

var _ stack.Protocol = (*STABLE)(nil)

// New returns a STABLE layer.
func New(cfg Config) *STABLE { return &STABLE{cfg: cfg, kick: make(chan struct{}, 1)} }

// Name returns "STABLE".
func (s *STABLE) Name() string { return "STABLE" }

// Init validates the config.
func (s *STABLE) Init() error { return s.cfg.Validate() }

// Start starts the gossip timer.
func (s *STABLE) Start() error {
	s.Go(func(done <-chan struct{}) {
		skipped := false
		for {
			d := s.cfg.Interval/2 + s.Rand().Duration(s.cfg.Interval)
			if skipped {
				// Waiting for the round's end: look again soon, so that
				// the next vote follows the announcement within a
				// quarter interval and rounds do not stretch by a whole
				// timer period.
				d = s.cfg.Interval/20 + s.Rand().Duration(s.cfg.Interval/5)
			}
			t := time.NewTimer(d)
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
				skipped = !s.timedVote()
			case <-s.kick:
				t.Stop()
				s.vote(false)
			}
		}
	})
	return nil
}

// Gossip sends this member's whole digest to the coordinator now (the
// coordinator takes its own).
func (s *STABLE) Gossip() { s.vote(true) }

// backstop is how many intervals a member waits for a round's
// announcement after its timed vote before it votes again anyway: the
// announcement is an unreliable multicast, and a round that changed
// nothing announces nothing.
const backstop = 3

// timedVote votes, unless this member's last timed vote is still waiting
// for its round to end: a round completes only once every member has
// voted, so a second vote in the same round would only overwrite the
// first at the coordinator.
//
// It reports whether it voted.
func (s *STABLE) timedVote() bool {
	s.mu.Lock()
	wait := s.waiting && time.Since(s.votedAt) < backstop*s.cfg.Interval
	s.mu.Unlock()
	if wait {
		s.skipped.Add(1)
		return false
	}
	s.vote(false)
	return true
}

// vote sends this member's digest to the coordinator: whole, or only the
// entries that changed since its last vote to this coordinator. Every
// wholeVoteEvery votes one is whole anyway.
func (s *STABLE) vote(whole bool) {
	s.mu.Lock()
	v := s.view
	s.bytes = 0
	s.mu.Unlock()
	if v == nil || v.Size() < 1 {
		return
	}
	d, err := stack.Ask(s.Context(), s, stack.EvGetDigest{})
	if err != nil {
		return
	}
	d = delivered(d)
	self, coord := s.LocalAddress(), v.Members[0]
	if coord == self {
		s.takeVote(v.ID, self, d, true)
		return
	}
	s.mu.Lock()
	if s.view != v {
		s.mu.Unlock()
		return
	}
	if s.sinceVote++; s.sinceVote >= wholeVoteEvery || s.voted == nil {
		whole = true
	}
	if whole {
		s.sinceVote = 0
	}
	send := changedSince(d, &s.voted, whole)
	s.waiting, s.votedAt = true, time.Now()
	s.mu.Unlock()
	parts := split(entries(v, send), s.perPart())
	for i, part := range parts {
		s.sent.Add(1)
		if err := s.send(coord, &Header{Type: TypeVote, Last: i == len(parts)-1, ViewID: v.ID, Entries: part}); err != nil {
			// Not sent (the stack is closing or the view moved on): the
			// coordinator did not hear what was recorded as voted, so the
			// next vote is whole.
			s.mu.Lock()
			if s.view == v {
				s.voted = nil
			}
			s.mu.Unlock()
			return
		}
	}
}

// delivered returns the entries of d with something delivered: a sender
// that a vote, a row or an announcement does not name counts as nothing
// delivered from it (which is always true), so the members of a large
// group that never send cost nothing in votes, in the coordinator's rows
// (N members by N senders) or in announcements.
func delivered(d stack.Digest) stack.Digest {
	out := d[:0:0]
	for _, e := range d {
		if e.HighestDelivered > 0 {
			out = append(out, e)
		}
	}
	return out
}

// changedSince returns the entries of d whose seqno differs from *last
// (all of d when whole) and records them in *last: what a vote or an
// announcement carries when it sends only what changed.
func changedSince(d stack.Digest, last *map[stack.Address]uint64, whole bool) stack.Digest {
	if *last == nil {
		*last, whole = make(map[stack.Address]uint64, len(d)), true
	}
	out := d
	if !whole {
		out = nil
		for _, e := range d {
			if hd, ok := (*last)[e.Member]; !ok || hd != e.HighestDelivered {
				out = append(out, e)
			}
		}
	}
	for _, e := range out {
		(*last)[e.Member] = e.HighestDelivered
	}
	return out
}

// split cuts d into parts of at most n entries; no entries make one
// empty part.
func split(d []Entry, n int) [][]Entry {
	parts := make([][]Entry, 0, len(d)/n+1)
	for len(d) > n {
		parts = append(parts, d[:n])
		d = d[n:]
	}
	return append(parts, d)
}

// send sends a vote (a reliable unicast to the coordinator) or an
// announcement (an unreliable multicast).
func (s *STABLE) send(dest stack.Address, h *Header) error {
	m := stack.NewMessage(dest, nil).Set(stack.Internal)
	if dest.IsZero() {
		m.Set(stack.NoReliability)
	}
	m.PutHeader(s.ID(), h)
	return s.PassDown(s.Context(), m)
}

// Up takes STABLE's messages; every other message counts towards max_bytes.
func (s *STABLE) Up(m *stack.Message) {
	if h, ok := m.Header(s.ID()).(*Header); ok {
		s.handle(m.Src, h)
		return
	}
	if m.IsMulticast() {
		s.count(int64(len(m.Payload)))
	}
	s.PassUp(m)
}

// PreservesBatches marks STABLE as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*STABLE) PreservesBatches() {}

// UpBatch takes the batch's STABLE messages and counts the rest, once per
// batch.
func (s *STABLE) UpBatch(b *stack.Batch) {
	if !b.MayHave(s.ID()) {
		// The messages of a batch have one destination.
		if n := b.PayloadBytes(); n > 0 && b.Dest.IsZero() {
			s.count(n)
		}
		s.PassUpBatch(b)
		return
	}
	var n int64
	b.Keep(func(m *stack.Message) bool {
		if h, ok := m.Header(s.ID()).(*Header); ok {
			s.handle(m.Src, h)
			return false
		}
		if m.IsMulticast() {
			n += int64(len(m.Payload))
		}
		return true
	})
	if n > 0 {
		s.count(n)
	}
	s.PassUpBatch(b)
}

// count adds n bytes of multicasts received and gossips once max_bytes
// have come since the last gossip.
func (s *STABLE) count(n int64) {
	s.mu.Lock()
	s.bytes += n
	now := s.bytes >= int64(s.cfg.MaxBytes)
	s.mu.Unlock()
	if now {
		s.vote(false)
	}
}

func (s *STABLE) handle(src stack.Address, h *Header) {
	switch h.Type {
	case TypeVote:
		s.received.Add(1)
		s.mu.Lock()
		v := s.view
		s.mu.Unlock()
		if v == nil || h.ViewID != v.ID {
			s.stale.Add(1)
			return
		}
		d, ok := h.Digest(v)
		if !ok {
			s.stale.Add(1)
			return
		}
		s.takeVote(h.ViewID, src, d, h.Last)
	case TypeStability:
		if src == s.LocalAddress() {
			return // the coordinator applied it when it sent it
		}
		s.mu.Lock()
		v := s.view
		ok := v != nil && h.ViewID == v.ID && v.Members[0] == src
		var d stack.Digest
		if ok {
			d, ok = h.Digest(v)
		}
		if ok && h.Last {
			s.waiting = false // the round this member voted in ended
		}
		s.mu.Unlock()
		if !ok {
			s.stale.Add(1)
			return
		}
		s.announced.Add(1)
		_, _ = s.PassDownEvent(s.Context(), stack.EvStable{Digest: d})
	}
}

// takeVote adds (part of) src's vote, d (last: its last part); once every
// member of the view has voted since the last round, the minimum per
// sender is stable: the coordinator purges it and announces it.
func (s *STABLE) takeVote(vid stack.ViewID, src stack.Address, d stack.Digest, last bool) {
	s.mu.Lock()
	v := s.view
	if v == nil || vid != v.ID || !v.Contains(src) || v.Members[0] != s.LocalAddress() {
		s.mu.Unlock()
		s.stale.Add(1)
		return
	}
	if s.rows == nil {
		s.rows, s.round, s.ahead = map[stack.Address]map[stack.Address]uint64{}, map[stack.Address]bool{}, map[stack.Address]bool{}
	}
	row := s.rows[src]
	if row == nil {
		row = make(map[stack.Address]uint64, len(d))
		s.rows[src] = row
	}
	for _, e := range d {
		// Within a view a member's delivered seqnos only grow; a vote
		// that overtook a later one changes nothing.
		row[e.Member] = max(row[e.Member], e.HighestDelivered)
	}
	if last {
		s.round[src] = true
		delete(s.ahead, src)
		// A member counted by its row stops counting once a vote of this
		// round is past it: under a steady load it has delivered more
		// since, and the round waits for its fresh vote as for anyone's.
		for m := range s.ahead {
			if past(row, s.rows[m]) {
				delete(s.ahead, m)
			}
		}
	}
	if len(s.round)+len(s.ahead) < v.Size() {
		s.mu.Unlock()
		return
	}
	var minD stack.Digest
	for sender, low := range s.rows[v.Members[0]] {
		all := true
		for _, m := range v.Members[1:] {
			row := s.rows[m]
			if row == nil {
				all = false
				break
			}
			low = min(low, row[sender]) // not named: nothing delivered from it (delivered)
		}
		if all && low > 0 {
			minD = append(minD, stack.DigestEntry{Member: sender, HighestDelivered: low})
		}
	}
	// A member whose row is already past what this round found stable
	// counts as voted in the next one (ahead) for as long as no vote of
	// that round is past its row: its newer vote may have come before
	// the round ended, and were it to vote again first, a round would
	// wait for a vote that, with the traffic over, may never come (votes
	// by max_bytes), and what everyone delivered would stay unannounced
	// until the next timed vote. Counted for good, it would end rounds
	// several times an interval under a steady load, where every member
	// but the earliest voter is past the minimum: the next round would
	// end at that member's next vote, and each announcement is a
	// multicast every member handles (20 members, 1 s intervals: 4.2
	// rounds a second against 0.85). Safety does not depend on rounds:
	// any announcement is the minimum of what the members said they
	// delivered.
	clear(s.round)
	clear(s.ahead)
	low := make(map[stack.Address]uint64, len(minD))
	for _, e := range minD {
		low[e.Member] = e.HighestDelivered
	}
	for _, m := range v.Members {
		if past(s.rows[m], low) {
			s.ahead[m] = true
		}
	}
	// Announce what changed since the last announcement, and everything
	// every wholeEvery rounds: a member that lost an announcement purges
	// a sender that fell silent a few rounds later, not never.
	whole := false
	if s.sinceAll++; s.told == nil || s.sinceAll >= wholeEvery {
		whole, s.sinceAll = true, 0
	}
	tell := changedSince(minD, &s.told, whole)
	s.mu.Unlock()
	s.rounds.Add(1)
	_, _ = s.PassDownEvent(s.Context(), stack.EvStable{Digest: minD})
	if v.Size() > 1 && len(tell) > 0 {
		parts := split(entries(v, tell), s.perPart())
		for i, part := range parts {
			_ = s.send(stack.Address{}, &Header{Type: TypeStability, Last: i == len(parts)-1, ViewID: v.ID, Entries: part})
		}
	}
}

// past reports whether row has a seqno past of's for some sender (one
// that of does not name counts as nothing delivered).
func past(row, of map[stack.Address]uint64) bool {
	for sender, seq := range row {
		if seq > of[sender] {
			return true
		}
	}
	return false
}

// DownEvent tracks the view. A new coordinator starts a new round; under
// the same one the round goes on without the members that left. Under the
// same coordinator, what was voted and announced stays for the members and
// senders in both views: a member's reliable-multicast table for a sender
// lives as long as the sender stays in its view, so its delivered seqno
// for that sender only grows, and the first votes of a view need not be
// whole (in a large group those cost N entries from each of N members at
// every join). A new coordinator starts afresh.
func (s *STABLE) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok {
		if v := vc.View; v != nil {
			s.mu.Lock()
			old := s.view
			s.view = v
			s.waiting = false
			if old == nil || len(old.Members) == 0 || len(v.Members) == 0 || old.Members[0] != v.Members[0] {
				s.voted, s.told, s.sinceVote, s.sinceAll = nil, nil, 0, 0
				clear(s.rows)
				clear(s.round)
				clear(s.ahead)
			} else {
				tests := len(s.voted) + len(s.told) + len(s.rows) + len(s.round) + len(s.ahead)
				for _, row := range s.rows {
					tests += len(row)
				}
				in := v.Lookup(tests) // votes name only senders that sent: few tests, but for a coordinator
				gone := func(a stack.Address, _ uint64) bool { return !in(a) }
				maps.DeleteFunc(s.voted, gone)
				maps.DeleteFunc(s.told, gone)
				maps.DeleteFunc(s.rows, func(m stack.Address, row map[stack.Address]uint64) bool {
					maps.DeleteFunc(row, gone)
					return !in(m)
				})
				// The round goes on: the votes it has are rows, valid
				// for as long as their voters stay. Restarted at each
				// view, it would never end while members join every few
				// seconds, and every member would keep every multicast
				// (the views themselves) until the joins stopped.
				maps.DeleteFunc(s.round, func(m stack.Address, _ bool) bool { return !in(m) })
				maps.DeleteFunc(s.ahead, func(m stack.Address, _ bool) bool { return !in(m) })
			}
			first := s.voted == nil && len(v.Members) > 1 && v.Members[0] != s.LocalAddress()
			s.mu.Unlock()
			if first {
				select {
				case s.kick <- struct{}{}:
				default:
				}
			}
		}
	}
	return s.PassDownEvent(ctx, ev)
}

// Stats reports STABLE's counters.
func (s *STABLE) Stats() []stack.Stat {
	return stack.CounterStats(s)
}
