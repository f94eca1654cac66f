package stack

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"

	"github.com/strata-go/strata/stack/wire"
)

// Transport is the bottom layer of a stack: it puts messages on a network
// and hands received ones to the stack's lanes. Transports embed
// TransportBase, which does the work every transport shares.
type Transport interface {
	Protocol
	transportBase() *TransportBase
}

// SourceAuthenticator is implemented by a layer that proves who sealed
// every message it passes up (ENCRYPT). A stack with one is not trusting its
// network: its transport learns where a member is only through
// AddressLearner, from messages that layer accepted, never from the
// unauthenticated preamble of a datagram.
type SourceAuthenticator interface {
	Protocol
	AuthenticatesSources()
}

// AddressLearner is implemented by a transport with network addresses. A
// SourceAuthenticator calls LearnAddress for every message it accepted:
// the member that sealed it (src) is at the network address the message
// came from (m.From).
type AddressLearner interface {
	LearnAddress(src Address, from netip.AddrPort)
}

// ReceiveBufferSizer is implemented by a transport that drops what does not
// fit in a bounded receive buffer, as a UDP socket does. Flow control sizes
// its credits to fit, so that senders within their credits are not dropped.
type ReceiveBufferSizer interface {
	// ReceiveBuffer returns the bytes of datagrams the buffer that takes
	// group messages (group true) or unicasts (false) holds, as the kernel
	// granted it; 0 if not known.
	ReceiveBuffer(group bool) int
}

// OwnMulticastReceiver is implemented by a transport whose group receive
// buffer may also hold the member's own multicasts (multicast loopback
// with no filter that drops them before the buffer). Flow control then
// counts the member among the senders that fill that buffer.
type OwnMulticastReceiver interface {
	ReceivesOwnMulticasts() bool
}

// Authenticated reports whether the stack has a SourceAuthenticator, so its
// transport must learn addresses only from what that layer accepted.
func (s *Stack) Authenticated() bool {
	for _, p := range s.Protocols() {
		if _, ok := p.(SourceAuthenticator); ok {
			return true
		}
	}
	return false
}

// TransportBase is embedded by transports (UDP, SIM). It sets message
// sources, loops messages back to the local member, decodes received
// bundles (dropping and counting bad ones) and delivers them on the lanes.
type TransportBase struct {
	Base
	counters TransportCounters
}

// TransportCounters are the statistics every transport keeps.
type TransportCounters struct {
	BundlesReceived  atomic.Int64 `stat:"bundles_received"`
	Loopbacks        atomic.Int64 `stat:"loopbacks"`
	DroppedMalformed atomic.Int64 `stat:"dropped_malformed"`
	DroppedVersion   atomic.Int64 `stat:"dropped_wrong_version"`
	DroppedCluster   atomic.Int64 `stat:"dropped_wrong_cluster"`
	DroppedOwn       atomic.Int64 `stat:"dropped_own_multicast"`
	DroppedNotForUs  atomic.Int64 `stat:"dropped_not_for_us"`

	// Per lane (index: Lane): messages and payload bytes. Stats reports
	// msgs_sent and msgs_received as their sums: a total of its own was
	// two more atomic additions per multicast sent and looped back.
	LaneMsgsSent  [numLanes]atomic.Int64
	LaneBytesSent [numLanes]atomic.Int64
	LaneMsgsRecv  [numLanes]atomic.Int64
	LaneBytesRecv [numLanes]atomic.Int64
}

// transportBase marks transports: only types embedding TransportBase
// implement Transport.
//
//lint:ignore U1000 called through the Transport interface (staticcheck misses the use in NewStack)
func (t *TransportBase) transportBase() *TransportBase { return t }

// DownEvent answers EvSendToPhysical with ErrNotSupported (a transport
// with network addresses overrides it) and ends every other event.
func (t *TransportBase) DownEvent(ctx context.Context, ev Event) (Answer, error) {
	if _, ok := ev.(EvSendToPhysical); ok {
		return Answer{}, ErrNotSupported
	}
	return t.PassDownEvent(ctx, ev)
}

// Counters returns the transport's counters for the transport to update and
// report.
func (t *TransportBase) Counters() *TransportCounters { return &t.counters }

// Stats reports the shared transport counters.
func (t *TransportBase) Stats() []Stat {
	c := &t.counters
	out := append([]Stat{{Name: "msgs_sent", Counter: true}, {Name: "msgs_received", Counter: true}}, CounterStats(c)...)
	if t.st != nil { // in a stack
		out = append(out, Stat{Name: "queued_bytes_peak", Value: t.st.lanes.peak.Load()})
		for l := range numLanes {
			out = append(out, Stat{Name: "dropped_queue_full_" + Lane(l).String(), Value: t.st.lanes.dropped[l].Load(), Counter: true})
		}
	}
	for l := range numLanes {
		name := Lane(l).String()
		sent, recv := c.LaneMsgsSent[l].Load(), c.LaneMsgsRecv[l].Load()
		out[0].Value += sent // loaded once, so the totals are the sums of the lanes reported
		out[1].Value += recv
		out = append(out,
			Stat{Name: "msgs_sent_" + name, Value: sent, Counter: true},
			Stat{Name: "bytes_sent_" + name, Value: c.LaneBytesSent[l].Load(), Counter: true},
			Stat{Name: "msgs_received_" + name, Value: recv, Counter: true},
			Stat{Name: "bytes_received_" + name, Value: c.LaneBytesRecv[l].Load(), Counter: true})
	}
	return out
}

// PrepareSend readies m for sending: it sets the source to the local address
// and delivers it to the local member when m is a multicast (unless
// DontLoopback) or a unicast to self. It reports whether m must go on the
// wire (false for a unicast to self).
func (t *TransportBase) PrepareSend(m *Message) bool {
	local := t.st.LocalAddress()
	if m.Src.IsZero() {
		m.Src = local
	}
	l := m.Lane()
	t.counters.LaneMsgsSent[l].Add(1)
	t.counters.LaneBytesSent[l].Add(int64(len(m.Payload)))
	switch {
	case m.Dest.IsZero():
		if !m.HasTransient(DontLoopback) {
			t.loopback(m)
		}
		return true
	case m.Dest == local:
		t.loopback(m)
		return false
	}
	return true
}

// loopback delivers m itself to the local member, not a copy. It may
// travel up while the bundler encodes it: no layer writes to a message it
// receives (those that change one, as COMPRESS and ENCRYPT do, make a copy,
// since the layers below may keep it for retransmission), and NAKACK hands
// up the message its table kept anyway. A copy per message cost 6% of a
// one-sender run's CPU.
func (t *TransportBase) loopback(m *Message) {
	t.counters.Loopbacks.Add(1)
	t.count(m.Lane(), 1, int64(len(m.Payload)))
	t.st.lanes.deliverOne(m, true)
}

// Deliver hands bt (one sender, one lane, one destination) to the lanes. The
// lanes own bt afterwards.
func (t *TransportBase) Deliver(bt *Batch) {
	var n int64
	for _, m := range bt.Msgs {
		n += int64(len(m.Payload))
	}
	t.count(bt.Lane, len(bt.Msgs), n)
	t.st.lanes.deliver(bt, false)
}

// count adds msgs messages of n payload bytes received on lane.
func (t *TransportBase) count(lane Lane, msgs int, n int64) {
	t.counters.LaneMsgsRecv[lane].Add(int64(msgs))
	t.counters.LaneBytesRecv[lane].Add(n)
}

// DefaultMaxQueued is the default of a transport's max_queued_bytes: four
// times the shipped stacks' max_credits, so that a sender within its
// credits is never dropped for want of room, and retransmissions fit too.
const DefaultMaxQueued = 16 << 20

// SetMaxQueued bounds the bytes each delivery queue holds (a transport's
// max_queued_bytes; 0: no bound). Per sender on the regular lane, per lane
// on the OOB and internal lanes; beyond it, received messages are dropped
// and counted (dropped_queue_full_<lane>), so a peer that ignores flow
// control cannot grow this member's memory. Transports call it from Init.
func (t *TransportBase) SetMaxQueued(n Size) { t.st.lanes.maxBytes.Store(int64(n)) }

// SetMaxDatagram records the largest datagram (or frame) the transport
// sends (its max_bundle_size; 0: no bound), for the layers that size their
// control messages by it (Stack.ControlLimit). Transports call it from Init.
func (t *TransportBase) SetMaxDatagram(n Size) { t.st.maxDgram.Store(int64(n)) }

// DefaultControlLimit is the control budget of a transport without a bound
// on its datagrams: what a 64 KB datagram leaves.
const DefaultControlLimit = 65000 - Headroom

// ControlLimit is how large a control message may be, a protocol's header
// and payload together, to fit one datagram of the transport with
// Headroom for the rest: the transport's largest datagram less Headroom
// (DefaultControlLimit when the transport has no bound). A protocol whose
// messages can grow with the group (GMS's views and digests, STABLE's
// votes) sends larger ones in parts of at most this size; the loader
// refuses a stack in which a protocol's smallest part would not fit
// (ControlSizer).
func (s *Stack) ControlLimit() int {
	if n := s.maxDgram.Load(); n > 0 {
		return int(n) - Headroom
	}
	return DefaultControlLimit
}

// Receive decodes a datagram holding a bundle and delivers its messages,
// split by lane. Bundles of another cluster or wire version, malformed input,
// own multicasts (already looped back) and unicasts for another member are
// counted and dropped. data must not be reused: payloads alias it. from is
// the network address the datagram came from (zero on a transport without
// network addresses); every message gets it as From. It returns the
// bundle's preamble and whether the bundle was accepted, so a transport can
// learn the sender's physical address. When it was not, no message was
// delivered and nothing refers to data any more: the transport may read
// its next datagram into the same bytes.
func (t *TransportBase) Receive(data []byte, from netip.AddrPort) (BundleHeader, bool) {
	cluster := t.st.Cluster()
	if cluster == "" {
		t.counters.DroppedCluster.Add(1)
		return BundleHeader{}, false
	}
	r := wire.NewReader(data)
	h, err := ReadBundleHeader(r, cluster)
	local := t.st.LocalAddress()
	if err == nil && h.Src == local && h.Multicast {
		// Own multicast, already looped back: dropped before its messages
		// are decoded (half the work a sender's reader does otherwise).
		t.counters.DroppedOwn.Add(int64(h.Count))
		return h, false
	}
	var msgs []*Message
	if err == nil {
		msgs, err = readBundleMessages(r, h)
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrWrongCluster):
		t.counters.DroppedCluster.Add(1)
		return h, false
	case errors.Is(err, ErrWrongVersion):
		t.counters.DroppedVersion.Add(1)
		return h, false
	default:
		t.counters.DroppedMalformed.Add(1)
		t.Log().Debug("dropped malformed bundle", "len", len(data), "err", err)
		return h, false
	}
	t.counters.BundlesReceived.Add(1)
	var bs [numLanes]*Batch
	for _, m := range msgs {
		if !m.Dest.IsZero() && m.Dest != local {
			t.counters.DroppedNotForUs.Add(1)
			continue
		}
		m.From = from
		l := m.Lane()
		b := bs[l]
		if b == nil || b.Src != m.Src || b.Dest != m.Dest {
			if b != nil {
				t.Deliver(b)
			}
			b = &Batch{Src: m.Src, Dest: m.Dest, Lane: l, Msgs: make([]*Message, 0, len(msgs))}
			bs[l] = b
		}
		b.Msgs = append(b.Msgs, m)
	}
	for _, b := range bs {
		if b != nil {
			t.Deliver(b)
		}
	}
	return h, true
}
