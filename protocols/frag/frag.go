// Package frag is FRAG: it splits messages whose payload is larger than
// frag_size into fragments and reassembles them at the receiver, for
// unicasts and multicasts, OOB ones too. Fragments travel through the
// reliable layers below, so each arrives exactly once; fragments of
// different messages and senders may interleave.
package frag

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures FRAG.
type Config struct {
	FragSize stack.Size    `toml:"frag_size" doc:"largest payload sent in one message; larger ones are fragmented"`
	MaxSize  stack.Size    `toml:"max_message_size" doc:"largest message a receiver reassembles; bigger announcements are dropped and counted"`
	Expiry   time.Duration `toml:"partial_expiry" doc:"a partly received message that gets no fragment for this long is dropped and counted"`
	// MaxPartials bounds what one sender's fragments can make a receiver
	// keep: a trickle of fragments that never complete (lost, or forged in
	// a member's name) would otherwise pile up for partial_expiry.
	MaxPartials int `toml:"max_partials_per_sender" doc:"partly received messages kept per sender; one more evicts the sender's one that grew least recently (counted)"`
}

// FragmentSize is frag_size, for the loader's check against the
// transport's largest datagram.
func (c *Config) FragmentSize() stack.Size { return c.FragSize }

// DefaultConfig returns FRAG's defaults.
func DefaultConfig() Config {
	return Config{FragSize: 60000, MaxSize: 1 << 30, Expiry: 2 * time.Minute, MaxPartials: 128}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.FragSize < 512 || c.FragSize > 65000:
		return stack.BadKey("frag_size", "must be between 512 bytes and 65000 (below the transport's max_bundle_size), got %d", c.FragSize)
	case c.MaxSize < c.FragSize:
		return stack.BadKey("max_message_size", "must be >= frag_size (%d), got %d", c.FragSize, c.MaxSize)
	case c.Expiry < time.Second:
		return stack.BadKey("partial_expiry", "must be at least 1s, got %s", c.Expiry)
	case c.MaxPartials < 1:
		return stack.BadKey("max_partials_per_sender", "must be at least 1, got %d", c.MaxPartials)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "FRAG", ID: stack.IDFRAG,
		Doc:      "fragments large messages and reassembles them",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDFRAG, Name: "FRAG", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{&Header{ID: 1, Index: 0, Count: 2, Total: 70000}, &Header{ID: 1 << 60, Index: 99, Count: 100, Total: 1 << 30}}
		},
	})
}

// Header marks a fragment: which message (per-sender id), which fragment,
// how many, and the total payload size.
type Header struct {
	ID           uint64
	Index, Count uint32
	Total        uint64
}

// Size returns the encoded length.
func (h *Header) Size() int {
	return wire.UvarintSize(h.ID) + wire.UvarintSize(uint64(h.Index)) + wire.UvarintSize(uint64(h.Count)) + wire.UvarintSize(h.Total)
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = wire.AppendUvarint(b, h.ID)
	b = wire.AppendUvarint(b, uint64(h.Index))
	b = wire.AppendUvarint(b, uint64(h.Count))
	return wire.AppendUvarint(b, h.Total)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{ID: r.Uvarint()}
	idx, cnt := r.Uvarint(), r.Uvarint()
	h.Total = r.Uvarint()
	if cnt == 0 || cnt > 1<<24 || idx >= cnt {
		r.Fail("fragment %d of %d", idx, cnt)
	}
	h.Index, h.Count = uint32(idx), uint32(cnt)
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// FRAG is the FRAG protocol.
type FRAG struct {
	stack.Base
	cfg    Config
	nextID atomic.Uint64

	mu      sync.Mutex
	partial map[key]*partial
	pending map[stack.Address]int // partial messages per sender

	fragmented  atomic.Int64 `stat:"msgs_fragmented"`
	fragsSent   atomic.Int64 `stat:"fragments_sent"`
	reassembled atomic.Int64 `stat:"msgs_reassembled"`
	fragsRecv   atomic.Int64 `stat:"fragments_received"`
	dropped     atomic.Int64 `stat:"fragments_dropped"`
	discarded   atomic.Int64 `stat:"partial_discarded"`
	expired     atomic.Int64 `stat:"partial_expired"`
	evicted     atomic.Int64 `stat:"partial_evicted"`
}

type key struct {
	src stack.Address
	id  uint64
}

// partial is a message being reassembled. It holds the fragments that came
// (their payloads, as received) and nothing more: what a fragment
// announces costs nothing until fragments arrive to fill it.
type partial struct {
	count   uint32
	total   uint64
	parts   map[uint32][]byte
	first   *stack.Message // carries the headers and flags of the original
	touched time.Time      // when the last fragment came
}

var _ stack.Protocol = (*FRAG)(nil)

// New returns a FRAG layer.
func New(cfg Config) *FRAG {
	return &FRAG{cfg: cfg, partial: map[key]*partial{}, pending: map[stack.Address]int{}}
}

// Name returns "FRAG".
func (f *FRAG) Name() string { return "FRAG" }

// Init validates the config.
func (f *FRAG) Init() error { return f.cfg.Validate() }

// Start expires partial messages that stopped growing.
func (f *FRAG) Start() error {
	f.GoEvery(f.cfg.Expiry/4, f.expire)
	return nil
}

func (f *FRAG) expire() {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, p := range f.partial {
		if now.Sub(p.touched) >= f.cfg.Expiry {
			f.removeLocked(k)
			f.expired.Add(1)
		}
	}
}

// removeLocked forgets partial message k; callers hold f.mu.
func (f *FRAG) removeLocked(k key) {
	delete(f.partial, k)
	if f.pending[k.src]--; f.pending[k.src] <= 0 {
		delete(f.pending, k.src)
	}
}

// makeRoomLocked evicts src's partial message that grew least recently if
// src has max_partials_per_sender already; callers hold f.mu.
func (f *FRAG) makeRoomLocked(src stack.Address) {
	if f.pending[src] < f.cfg.MaxPartials {
		return
	}
	var oldest key
	var at time.Time
	found := false
	for k, p := range f.partial {
		if k.src == src && (!found || p.touched.Before(at)) {
			oldest, at, found = k, p.touched, true
		}
	}
	if found {
		f.removeLocked(oldest)
		f.evicted.Add(1)
	}
}

// Down sends m whole or in fragments of frag_size.
func (f *FRAG) Down(ctx context.Context, m *stack.Message) error {
	size := len(m.Payload)
	fs := int(f.cfg.FragSize)
	if size <= fs {
		return f.PassDown(ctx, m)
	}
	count := (size + fs - 1) / fs
	id := f.nextID.Add(1)
	f.fragmented.Add(1)
	for i := range count {
		c := m.Copy() // same destination, flags and headers of the layers above
		c.Payload = m.Payload[i*fs : min(size, (i+1)*fs)]
		c.PutHeader(f.ID(), &Header{ID: id, Index: uint32(i), Count: uint32(count), Total: uint64(size)})
		if m.HasTransient(stack.DontLoopback) {
			c.SetTransient(stack.DontLoopback)
		}
		f.fragsSent.Add(1)
		if err := f.PassDown(ctx, c); err != nil {
			return fmt.Errorf("frag: fragment %d of %d: %w", i+1, count, err)
		}
	}
	return nil
}

// Up collects fragments; a complete message goes up with the original's
// flags and headers.
func (f *FRAG) Up(m *stack.Message) {
	h, ok := m.Header(f.ID()).(*Header)
	if !ok {
		f.PassUp(m)
		return
	}
	f.fragsRecv.Add(1)
	fs := uint64(f.cfg.FragSize)
	if h.Total > uint64(f.cfg.MaxSize) || uint64(h.Count) != (h.Total+fs-1)/fs ||
		uint64(len(m.Payload)) != min(fs, h.Total-uint64(h.Index)*fs) {
		f.dropped.Add(1) // inconsistent or too big: another frag_size, or hostile
		return
	}
	k := key{m.Src, h.ID}
	f.mu.Lock()
	p := f.partial[k]
	if p == nil {
		f.makeRoomLocked(m.Src)
		p = &partial{count: h.Count, total: h.Total, parts: map[uint32][]byte{}}
		f.partial[k] = p
		f.pending[m.Src]++
	}
	if p.count != h.Count || p.total != h.Total || p.parts[h.Index] != nil {
		f.mu.Unlock()
		f.dropped.Add(1)
		return
	}
	// A received payload aliases its datagram's receive chunk, and keeps
	// all of it (up to a MB) for as long as it is referred to. A partial
	// message may wait minutes for its other fragments: a short fragment
	// (or a first one, for its headers) that has to wait is kept as a
	// copy, so that a trickle of fragments that never complete costs what
	// they hold, not a chunk each.
	done := uint32(len(p.parts))+1 == h.Count
	part, first := m.Payload, m
	if !done {
		if uint64(len(part)) <= fs/8 {
			part = bytes.Clone(part)
		}
		if h.Index == 0 {
			first = m.Copy()
			first.Payload = nil
		}
	}
	p.parts[h.Index] = part
	p.touched = time.Now()
	if h.Index == 0 {
		p.first = first
	}
	if done {
		f.removeLocked(k)
	}
	f.mu.Unlock()
	if !done {
		return
	}
	buf := make([]byte, p.total)
	for i, part := range p.parts {
		copy(buf[uint64(i)*fs:], part)
	}
	whole := p.first.Copy()
	whole.RemoveHeader(f.ID())
	whole.Payload = buf
	whole.SetReceipt(m.Receipt()) // the last fragment's: it completed the message
	f.reassembled.Add(1)
	f.PassUp(whole)
}

// DownEvent discards partial messages of members who left the view (when
// this layer is below the membership layer; UpEvent when above).
func (f *FRAG) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok && vc.View != nil {
		v := vc.View
		f.viewChange(v)
	}
	return f.PassDownEvent(ctx, ev)
}

// UpEvent is DownEvent for a view passed up.
func (f *FRAG) UpEvent(ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok && vc.View != nil {
		v := vc.View
		f.viewChange(v)
	}
	return f.PassUpEvent(ev)
}

func (f *FRAG) viewChange(v *stack.View) {
	f.mu.Lock()
	for k := range f.partial {
		if !v.Contains(k.src) {
			f.removeLocked(k)
			f.discarded.Add(1)
		}
	}
	f.mu.Unlock()
}

// Stats reports FRAG's counters.
func (f *FRAG) Stats() []stack.Stat {
	f.mu.Lock()
	n := len(f.partial)
	f.mu.Unlock()
	return append(stack.CounterStats(f),
		stack.Stat{Name: "partial_in_progress", Value: int64(n)},
	)
}
