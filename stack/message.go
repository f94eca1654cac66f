package stack

import (
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
)

// Flags are per-message options that travel on the wire.
type Flags uint16

// Message flags.
const (
	// OOB messages are delivered as soon as they arrive, concurrently and in
	// no order; reliable protocols still retransmit and de-duplicate them.
	OOB Flags = 1 << iota
	// Internal marks protocol control traffic: delivered on the internal lane
	// and never held back by a blocking layer on the way down.
	Internal
	// DontBundle asks the transport to send the message at once, not behind
	// a bundle.
	DontBundle
	// NoFC makes flow-control layers let the message pass without credits.
	NoFC
	// NoReliability makes reliable layers pass the message untouched (no
	// seqno, no retransmission).
	NoReliability
	// RSVP asks for the message to be acknowledged by its receivers.
	RSVP

	flagsMask = OOB | Internal | DontBundle | NoFC | NoReliability | RSVP
)

var flagNames = []string{"OOB", "INTERNAL", "DONT_BUNDLE", "NO_FC", "NO_RELIABILITY", "RSVP"}

// String lists the set flags, e.g. "OOB|INTERNAL".
func (f Flags) String() string { return bitNames(uint32(f), flagNames) }

// TransientFlags are per-message marks that stay in this process: they are
// never encoded and never copied.
type TransientFlags uint32

// Transient flags.
const (
	// DontLoopback: a multicast is sent to the others but not delivered to
	// the sender itself.
	DontLoopback TransientFlags = 1 << iota
	// OOBDelivered is set (atomically) by the layer that passed an OOB
	// message up, so it is delivered exactly once.
	OOBDelivered
	// DontBlock makes a full transport queue drop the message (and count it)
	// instead of blocking the sender.
	DontBlock
)

var transientNames = []string{"DONT_LOOPBACK", "OOB_DELIVERED", "DONT_BLOCK"}

// String lists the set transient flags.
func (f TransientFlags) String() string { return bitNames(uint32(f), transientNames) }

func bitNames(v uint32, names []string) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	for i, n := range names {
		if v&(1<<i) != 0 {
			parts = append(parts, n)
			v &^= 1 << i
		}
	}
	if v != 0 {
		parts = append(parts, fmt.Sprintf("%#x", v))
	}
	return strings.Join(parts, "|")
}

// Lane is the delivery path a received message takes.
type Lane uint8

// The three lanes.
const (
	// LaneRegular delivers per-sender FIFO, one goroutine per sender at a
	// time, different senders in parallel.
	LaneRegular Lane = iota
	// LaneOOB delivers as messages come, concurrently.
	LaneOOB
	// LaneInternal carries protocol control traffic on its own workers.
	LaneInternal
	numLanes
)

var laneNames = [...]string{"regular", "oob", "internal"}

func (l Lane) String() string {
	if int(l) < len(laneNames) {
		return laneNames[l]
	}
	return fmt.Sprintf("lane(%d)", l)
}

// inlineHeaders is how many headers a message holds without allocating;
// more spill into a slice. The shipped stacks put one to three on an
// application message (NAKACK or UNICAST2, FRAG, ENCRYPT); four keeps a
// Message at 208 bytes, a size class below the 288 of six (every message
// sent and received is one allocation of it, or a slab's share).
const inlineHeaders = 4

type hdrEntry struct {
	id  uint16
	hdr Header
}

// Message is the unit that travels through a stack. Dest zero means the whole
// group. Payload and headers are shared by copies, so neither may be modified
// after the message is sent; use DeepCopy for a private payload. A message is
// sent once: send a Copy to send it again, even after Send returned an error
// (it may have been numbered, kept and delivered locally already). A
// received message is read-only too: a member's own messages come back as
// the very messages it sent, which the transport may still be encoding. A received
// payload aliases the transport's receive memory (with UDP, a chunk of up to
// 1 MB that is reused only once nothing refers into it): keeping a short
// payload for long keeps that memory too, so copy what you keep.
//
// A Message must not be copied by value (it holds an atomic); use Copy.
type Message struct {
	Dest    Address
	Src     Address
	Flags   Flags
	Payload []byte
	// From is the network address the message arrived from, set by a
	// transport that has network addresses (zero otherwise, and on sent
	// messages). It is never encoded; layers above that authenticate the
	// sender (ENCRYPT) or learn addresses (discovery) use it instead of
	// any address a message claims in its body.
	From netip.AddrPort

	transient atomic.Uint32
	nh        uint8
	ids       [inlineHeaders]uint16 // the protocol ids of hdrs, apart so the two pack
	hdrs      [inlineHeaders]Header
	more      []hdrEntry
	receipt   *Receipt
}

// Receipt tells a layer that passes messages up when they have reached
// the application: the channel marks it as a message arrives, before the
// callback runs. NAKACK uses it so that a flush waits for the messages on
// their way up the stack, never for what the application does with them.
//
// Between Admit and Release, the messages carrying it also count as
// delivered in the view current at Admit: a view that comes meanwhile
// reaches the application after them, even when a layer between splits
// them up and the first one marks the receipt (and lets a flush install
// that view) while the others are still on their way.
type Receipt struct {
	taken  atomic.Bool
	notify func()
	cb     *callbacks // the channel's, or nil
	ep     atomic.Pointer[epoch]
}

// NewReceipt returns a receipt for messages passed up s that calls notify
// (if not nil) when it is first marked after a Reset.
func NewReceipt(s *Stack, notify func()) *Receipt {
	r := &Receipt{notify: notify}
	if s != nil && s.top.ch != nil {
		r.cb = s.top.ch.cb
	}
	return r
}

// Reset clears the mark before the receipt goes out with new messages.
func (r *Receipt) Reset() { r.taken.Store(false) }

// Taken reports whether a message carrying r has reached the application
// since the last Reset.
func (r *Receipt) Taken() bool { return r.taken.Load() }

func (r *Receipt) take() {
	if !r.taken.Load() && r.taken.CompareAndSwap(false, true) && r.notify != nil {
		r.notify()
	}
}

// Admit counts the messages about to be passed up with r in the current
// view, until Release; the caller passes them up on its own goroutine in
// between. A few atomic operations.
func (r *Receipt) Admit() {
	if r.cb != nil {
		r.ep.Store(r.cb.enter())
	}
}

// Release ends what Admit began, once the messages have been passed up.
func (r *Receipt) Release() {
	if e := r.ep.Swap(nil); e != nil {
		r.cb.leave(e)
	}
}

// SetReceipt attaches r to m, to be marked when m reaches the application
// (see Receipt). Copies of m do not carry it; a layer that replaces m by
// another message (FRAG's reassembly) passes it on.
func (m *Message) SetReceipt(r *Receipt) { m.receipt = r }

// Receipt returns the receipt attached to m, if any.
func (m *Message) Receipt() *Receipt { return m.receipt }

// NewMessage returns a message to dest (zero: the group) with payload.
func NewMessage(dest Address, payload []byte) *Message {
	return &Message{Dest: dest, Payload: payload}
}

// IsMulticast reports whether the message goes to the whole group.
func (m *Message) IsMulticast() bool { return m.Dest.IsZero() }

// Has reports whether all of f are set.
func (m *Message) Has(f Flags) bool { return m.Flags&f == f }

// Set sets f and returns m, for chaining.
func (m *Message) Set(f Flags) *Message { m.Flags |= f; return m }

// Clear clears f and returns m.
func (m *Message) Clear(f Flags) *Message { m.Flags &^= f; return m }

// Lane returns the lane the message is delivered on: internal, OOB or
// regular, in that order of precedence.
func (m *Message) Lane() Lane {
	switch {
	case m.Flags&Internal != 0:
		return LaneInternal
	case m.Flags&OOB != 0:
		return LaneOOB
	}
	return LaneRegular
}

// Transient returns the transient flags.
func (m *Message) Transient() TransientFlags { return TransientFlags(m.transient.Load()) }

// HasTransient reports whether all of f are set.
func (m *Message) HasTransient(f TransientFlags) bool { return m.Transient()&f == f }

// SetTransient sets f and returns m.
func (m *Message) SetTransient(f TransientFlags) *Message {
	m.transient.Or(uint32(f))
	return m
}

// SetTransientIfAbsent sets f and reports whether this call set it (false if
// it was already set): the compare-and-set that makes OOB delivery exactly
// once.
func (m *Message) SetTransientIfAbsent(f TransientFlags) bool {
	old := m.transient.Or(uint32(f))
	return TransientFlags(old)&f == 0
}

// Header returns the header of protocol id, or nil.
func (m *Message) Header(id uint16) Header {
	n := int(m.nh)
	for i := 0; i < n && i < inlineHeaders; i++ {
		if m.ids[i] == id {
			return m.hdrs[i]
		}
	}
	for _, e := range m.more {
		if e.id == id {
			return e.hdr
		}
	}
	return nil
}

// PutHeader sets the header of protocol id, replacing an existing one, and
// returns m.
func (m *Message) PutHeader(id uint16, h Header) *Message {
	if h == nil {
		panic("stack: PutHeader with nil header")
	}
	n := int(m.nh)
	for i := 0; i < n && i < inlineHeaders; i++ {
		if m.ids[i] == id {
			m.hdrs[i] = h
			return m
		}
	}
	for i := range m.more {
		if m.more[i].id == id {
			m.more[i].hdr = h
			return m
		}
	}
	if n < inlineHeaders {
		m.ids[n], m.hdrs[n] = id, h
	} else {
		m.more = append(m.more, hdrEntry{id, h})
	}
	m.nh++
	return m
}

// RemoveHeader removes the header of protocol id and returns it (nil if
// there was none).
func (m *Message) RemoveHeader(id uint16) Header {
	all := m.headerSlice(nil)
	for i, e := range all {
		if e.id == id {
			all = append(all[:i], all[i+1:]...)
			m.setHeaders(all)
			return e.hdr
		}
	}
	return nil
}

// NumHeaders returns the number of headers.
func (m *Message) NumHeaders() int { return int(m.nh) }

// EachHeader calls f for every header in insertion order.
func (m *Message) EachHeader(f func(id uint16, h Header)) {
	n := min(int(m.nh), inlineHeaders)
	for i := range n {
		f(m.ids[i], m.hdrs[i])
	}
	for _, e := range m.more {
		f(e.id, e.hdr)
	}
}

func (m *Message) headerSlice(dst []hdrEntry) []hdrEntry {
	n := min(int(m.nh), inlineHeaders)
	for i := range n {
		dst = append(dst, hdrEntry{m.ids[i], m.hdrs[i]})
	}
	return append(dst, m.more...)
}

func (m *Message) setHeaders(all []hdrEntry) {
	m.ids, m.hdrs = [inlineHeaders]uint16{}, [inlineHeaders]Header{}
	m.more = nil
	m.nh = uint8(len(all))
	n := min(len(all), inlineHeaders)
	for i, e := range all[:n] {
		m.ids[i], m.hdrs[i] = e.id, e.hdr
	}
	if len(all) > n {
		m.more = append([]hdrEntry(nil), all[n:]...)
	}
}

// Copy returns a new message with the same destination, source, flags,
// headers and payload (the payload and headers are shared, not copied).
// Transient flags are not copied.
func (m *Message) Copy() *Message {
	c := &Message{}
	m.copyInto(c)
	return c
}

// copyInto makes c, a zero Message, what Copy returns.
func (m *Message) copyInto(c *Message) {
	c.Dest, c.Src, c.Flags, c.Payload, c.From, c.nh, c.ids, c.hdrs = m.Dest, m.Src, m.Flags, m.Payload, m.From, m.nh, m.ids, m.hdrs
	if len(m.more) > 0 {
		c.more = append([]hdrEntry(nil), m.more...)
	}
}

// DeepCopy is Copy with a private copy of the payload.
func (m *Message) DeepCopy() *Message {
	c := m.Copy()
	if m.Payload != nil {
		c.Payload = append(make([]byte, 0, len(m.Payload)), m.Payload...)
	}
	return c
}

// String summarises the message for logs.
func (m *Message) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s -> ", m.Src)
	if m.IsMulticast() {
		b.WriteString("<group>")
	} else {
		b.WriteString(m.Dest.String())
	}
	fmt.Fprintf(&b, ", %d bytes", len(m.Payload))
	if m.Flags != 0 {
		fmt.Fprintf(&b, ", flags=%s", m.Flags)
	}
	if m.nh > 0 {
		b.WriteString(", hdrs=")
		first := true
		m.EachHeader(func(id uint16, h Header) {
			if !first {
				b.WriteString(",")
			}
			first = false
			name := fmt.Sprint(id)
			if t, ok := lookupHeader(id); ok {
				name = t.name
			}
			fmt.Fprintf(&b, "%s:%v", name, h)
		})
	}
	b.WriteString("]")
	return b.String()
}

// Batch is a group of received messages from one sender, for one lane, handed
// up a stack in one call. A protocol may process it as a whole (one lock for
// the batch) and remove what it consumes. A batch is owned by the goroutine
// that passes it up; do not keep it after the call returns (keep messages).
type Batch struct {
	Src  Address
	Dest Address // zero: the messages were multicasts
	Lane Lane
	Msgs []*Message

	sum batchSummary // see MayHave
}

// batchSummary describes a batch's messages so that a layer can tell
// without reading them that none is its own: which protocols' headers
// they may carry, their flags and their payload bytes. It holds for the
// Msgs it was made for (the same first slot and length) as long as no
// layer replaced a message or added a header on the way up: Keep and Add
// keep it true, and PassUpBatch forgets it after a layer that is not a
// BatchPreserver. Each layer walked every message of every batch before
// (one header lookup and closure call per message and layer: 8% of a
// one-sender run's CPU, and most of the cost of a member's own multicasts).
type batchSummary struct {
	slot  **Message // &Msgs[0] when made; nil: no summary
	n     int       // len(Msgs) when made
	ids   uint64    // bit id%64 set for each protocol id a message has a header of
	flags Flags     // the messages' flags, or-ed
	bytes int64     // the messages' payload bytes
}

func (s *batchSummary) add(m *Message) {
	for i := 0; i < int(m.nh) && i < inlineHeaders; i++ {
		s.ids |= 1 << (m.ids[i] & 63)
	}
	for _, e := range m.more {
		s.ids |= 1 << (e.id & 63)
	}
	s.flags |= m.Flags
	s.bytes += int64(len(m.Payload))
}

// summary returns b's summary, made now if b has none that holds.
func (b *Batch) summary() *batchSummary {
	s := &b.sum
	if len(b.Msgs) == 0 {
		*s = batchSummary{}
		return s
	}
	if s.slot == &b.Msgs[0] && s.n == len(b.Msgs) {
		return s
	}
	*s = batchSummary{slot: &b.Msgs[0], n: len(b.Msgs)}
	for _, m := range b.Msgs {
		s.add(m)
	}
	return s
}

// held reports whether b has a summary that holds, without making one.
func (b *Batch) held() bool {
	return len(b.Msgs) > 0 && b.sum.slot == &b.Msgs[0] && b.sum.n == len(b.Msgs)
}

// forget drops b's summary: a layer may have changed its messages.
func (b *Batch) forget() { b.sum = batchSummary{} }

// MayHave reports whether a message of b may carry the header of protocol
// id; false means that none does, so a layer can pass b up without looking
// at its messages. The first call on a batch reads every message once;
// the layers above it then read none.
func (b *Batch) MayHave(id uint16) bool { return b.summary().ids&(1<<(id&63)) != 0 }

// MayHaveFlags reports whether a message of b may have one of the flags f;
// false means that none has.
func (b *Batch) MayHaveFlags(f Flags) bool { return b.summary().flags&f != 0 }

// PayloadBytes returns the payload bytes of b's messages.
func (b *Batch) PayloadBytes() int64 { return b.summary().bytes }

// Len returns the number of messages.
func (b *Batch) Len() int { return len(b.Msgs) }

// Add appends messages, and keeps b's summary, if it has one, true.
func (b *Batch) Add(ms ...*Message) {
	held := b.held()
	b.Msgs = append(b.Msgs, ms...)
	if !held {
		return
	}
	for _, m := range ms {
		b.sum.add(m)
	}
	b.sum.slot, b.sum.n = &b.Msgs[0], len(b.Msgs)
}

// Keep removes every message for which keep returns false, preserving
// order. b's summary, if it has one, stays true: keep may remove headers
// from the messages it keeps but must not add any.
func (b *Batch) Keep(keep func(*Message) bool) {
	// Nothing is written until the first message goes: most batches keep
	// every message, and each write of a pointer costs a write barrier
	// while the GC runs.
	// The bytes of what goes are read before keep sees it.
	held := b.held()
	i, gone := 0, int64(0)
	for ; i < len(b.Msgs); i++ {
		if n := len(b.Msgs[i].Payload); !keep(b.Msgs[i]) {
			gone = int64(n)
			break
		}
	}
	if i == len(b.Msgs) {
		return
	}
	out := b.Msgs[:i]
	for _, m := range b.Msgs[i+1:] {
		if n := len(m.Payload); keep(m) {
			out = append(out, m)
		} else {
			gone += int64(n)
		}
	}
	clear(b.Msgs[len(out):])
	b.Msgs = out
	switch {
	case !held || len(out) == 0:
		b.forget()
	default:
		b.sum.slot, b.sum.n = &b.Msgs[0], len(out)
		b.sum.bytes -= gone
	}
}

// Reset empties the batch for reuse, keeping its capacity.
func (b *Batch) Reset() {
	clear(b.Msgs)
	b.Msgs = b.Msgs[:0]
	b.Src, b.Dest, b.Lane = Address{}, Address{}, LaneRegular
	b.forget()
}
