package groupfc

import (
	"context"
	"errors"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- sending

// Broadcast sends payload to every member, waiting while a receiver's
// window is too small.
func (p *GROUPFC) Broadcast(ctx context.Context, payload []byte) error {
	return p.broadcast(ctx, stack.NewMessage(stack.Address{}, payload), typeBcast, 0, true)
}

// TryBroadcast is Broadcast that returns ErrWouldBlock instead of waiting.
func (p *GROUPFC) TryBroadcast(payload []byte) error {
	return p.broadcast(context.Background(), stack.NewMessage(stack.Address{}, payload), typeBcast, 0, false)
}

// Multicast sends payload to every member of instance inst (as a unicast
// if there is exactly one).
func (p *GROUPFC) Multicast(ctx context.Context, inst uint64, payload []byte) error {
	return p.multicast(ctx, inst, payload, true)
}

// TryMulticast is Multicast that returns ErrWouldBlock instead of waiting.
func (p *GROUPFC) TryMulticast(inst uint64, payload []byte) error {
	return p.multicast(context.Background(), inst, payload, false)
}

// Anycast sends payload to one member of instance inst: the next one,
// round robin, whose window takes it, or else waits for the first. It
// returns the member chosen.
func (p *GROUPFC) Anycast(ctx context.Context, inst uint64, payload []byte) (stack.Address, error) {
	return p.anycast(ctx, inst, payload, true)
}

// TryAnycast is Anycast that returns ErrWouldBlock instead of waiting.
func (p *GROUPFC) TryAnycast(inst uint64, payload []byte) (stack.Address, error) {
	return p.anycast(context.Background(), inst, payload, false)
}

// Unicast sends payload to member dest.
func (p *GROUPFC) Unicast(ctx context.Context, dest stack.Address, payload []byte) error {
	return p.unicast(ctx, stack.NewMessage(dest, payload), true)
}

// TryUnicast is Unicast that returns ErrWouldBlock instead of waiting.
func (p *GROUPFC) TryUnicast(dest stack.Address, payload []byte) error {
	return p.unicast(context.Background(), stack.NewMessage(dest, payload), false)
}

// Down sends the application's messages through the group: a multicast as
// a broadcast, a unicast as a unicast. Internal and NO_FC messages pass.
func (p *GROUPFC) Down(ctx context.Context, m *stack.Message) error {
	if m.Has(stack.Internal) || m.Has(stack.NoFC) || m.Header(p.ID()) != nil {
		return p.PassDown(ctx, m)
	}
	if m.IsMulticast() {
		return p.broadcast(ctx, m, typeBcast, 0, true)
	}
	return p.unicast(ctx, m, true)
}

// wait blocks until the group state changes (or ctx ends); callers hold
// p.mu and sendMu, which it releases while waiting and takes again.
func (p *GROUPFC) wait(ctx context.Context, block bool, since *time.Time) error {
	if !block {
		p.wouldBlock.Add(1)
		return ErrWouldBlock
	}
	if since.IsZero() {
		*since = time.Now()
		p.blockedSends.Add(1)
	}
	ch := p.wakeCh
	out := p.takeOut()
	p.mu.Unlock()
	p.sendMu.Unlock()
	p.sendOut(out)
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	case <-p.Done():
		err = stack.ErrClosed
	}
	p.sendMu.Lock()
	p.mu.Lock()
	return err
}

// acquire takes sendMu and mu and waits until ready says the send may go
// (true) or must fail (an error); it returns holding both locks when the
// send may go, and neither on an error.
func (p *GROUPFC) acquire(ctx context.Context, block bool, since *time.Time, ready func() (bool, error)) error {
	p.sendMu.Lock()
	p.mu.Lock()
	for {
		ok, err := false, ErrNotJoined
		if p.g != nil && p.g.joined {
			ok, err = ready()
		}
		if ok {
			return nil
		}
		if err == nil {
			err = p.wait(ctx, block, since)
		}
		if err != nil {
			p.mu.Unlock()
			p.sendMu.Unlock()
			return err
		}
	}
}

func (p *GROUPFC) endWait(since time.Time) {
	if !since.IsZero() {
		p.blockedNanos.Add(int64(time.Since(since)))
	}
}

func (p *GROUPFC) broadcast(ctx context.Context, m *stack.Message, typ uint8, inst uint64, block bool) error {
	if len(m.Payload) > MaxMessageSize {
		return ErrTooLarge
	}
	blks := blocks(len(m.Payload))
	var since time.Time
	defer func() { p.endWait(since) }()
	if err := p.acquire(ctx, block, &since, func() (bool, error) { return !p.g.bcCong(blks), nil }); err != nil {
		return err
	}
	g := p.g
	ack := g.mandatory
	h := &Header{Type: typ, Seqno: g.bcSndNxt, AckReq: ack, Instance: inst}
	rs := g.sentBroadcast(blks, ack)
	var to []stack.Address
	if ack {
		for _, r := range rs {
			to = append(to, r.addr)
		}
	}
	self := g.loopback && (typ == typeBcast || inst == g.instance)
	out := p.takeOut()
	p.mu.Unlock()
	p.sendOut(out)
	var err error
	if ack {
		// The first broadcast after a unicast goes by the unicast path,
		// so it cannot overtake that unicast (spec §5).
		for _, a := range to {
			c := m.Copy()
			c.Dest = a
			c.PutHeader(p.ID(), h)
			err = errors.Join(err, p.PassDown(ctx, c))
		}
	} else {
		m.PutHeader(p.ID(), h)
		err = p.PassDown(ctx, m)
	}
	p.sendMu.Unlock()
	if self {
		p.deliverOwn(m)
	}
	return err
}

func (p *GROUPFC) multicast(ctx context.Context, inst uint64, payload []byte, block bool) error {
	p.mu.Lock()
	if p.g == nil || !p.g.joined {
		p.mu.Unlock()
		return ErrNotJoined
	}
	rs := p.g.receivers(inst)
	p.mu.Unlock()
	switch len(rs) {
	case 0:
		p.unreachable.Add(1)
		return ErrHostUnreachable
	case 1:
		return p.unicast(ctx, stack.NewMessage(rs[0].addr, payload), block)
	}
	return p.broadcast(ctx, stack.NewMessage(stack.Address{}, payload), typeMcast, inst, block)
}

func (p *GROUPFC) unicast(ctx context.Context, m *stack.Message, block bool) error {
	if len(m.Payload) > MaxMessageSize {
		return ErrTooLarge
	}
	blks := blocks(len(m.Payload))
	var since time.Time
	defer func() { p.endWait(since) }()
	var r *member
	err := p.acquire(ctx, block, &since, func() (bool, error) {
		r = p.g.members[m.Dest]
		if r == nil || !r.isReceiver() || (r.addr == p.g.self && !p.g.loopback) {
			p.unreachable.Add(1)
			return false, ErrHostUnreachable
		}
		return !p.g.cong(r, blks), nil
	})
	if err != nil {
		return err
	}
	return p.sendUnicastLocked(ctx, m, r, blks)
}

// sendUnicastLocked sends m to r; callers hold sendMu and mu, which it
// releases.
func (p *GROUPFC) sendUnicastLocked(ctx context.Context, m *stack.Message, r *member, blks int) error {
	if r.addr == p.g.self {
		p.mu.Unlock()
		p.sendMu.Unlock()
		p.deliverOwn(m)
		return nil
	}
	h := &Header{Type: typeUcast, Seqno: p.g.bcSndNxt}
	p.g.sentUnicast(r, blks)
	out := p.takeOut()
	p.mu.Unlock()
	p.sendOut(out)
	m.Dest = r.addr
	m.PutHeader(p.ID(), h)
	err := p.PassDown(ctx, m)
	p.sendMu.Unlock()
	return err
}

func (p *GROUPFC) anycast(ctx context.Context, inst uint64, payload []byte, block bool) (stack.Address, error) {
	if len(payload) > MaxMessageSize {
		return stack.Address{}, ErrTooLarge
	}
	blks := blocks(len(payload))
	var since time.Time
	defer func() { p.endWait(since) }()
	var pick *member
	err := p.acquire(ctx, block, &since, func() (bool, error) {
		rs := p.g.receivers(inst)
		if len(rs) == 0 {
			p.unreachable.Add(1)
			return false, ErrHostUnreachable
		}
		start := p.rr[inst] % len(rs)
		for i := range rs {
			if c := rs[(start+i)%len(rs)]; c.addr == p.g.self || c.window >= blks {
				pick, p.rr[inst] = c, start+i+1
				return true, nil
			}
		}
		p.g.cong(rs[start], blks) // nudge the one we wait for
		return false, nil
	})
	if err != nil {
		return stack.Address{}, err
	}
	return pick.addr, p.sendUnicastLocked(ctx, stack.NewMessage(pick.addr, payload), pick, blks)
}

// deliverOwn passes up this member's own message (loopback).
func (p *GROUPFC) deliverOwn(m *stack.Message) {
	c := m.Copy()
	c.Src = p.LocalAddress()
	p.mu.Lock()
	inst := p.cfg.Instance
	p.mu.Unlock()
	c.PutHeader(p.ID(), &delivered{instance: inst})
	p.delivered_.Add(1)
	p.PassUp(c)
}
