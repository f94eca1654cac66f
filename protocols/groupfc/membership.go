package groupfc

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- membership

// unawait stops waiting for a's LEAVE_ACK; callers hold p.mu.
func (p *GROUPFC) unawait(a stack.Address) {
	if p.leaveWait[a] {
		delete(p.leaveWait, a)
		if len(p.leaveWait) == 0 {
			close(p.leaveDone)
		}
	}
}

// awaited returns the members whose LEAVE_ACK this member still awaits.
func (p *GROUPFC) awaited() []stack.Address {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.SortedFunc(maps.Keys(p.leaveWait), stack.Address.Compare)
}

// DownEvent follows the view (members appear and disappear) and sends
// LEAVE to every member on disconnect.
func (p *GROUPFC) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		if v := e.View; v != nil {
			p.viewChange(v)
		}
	case stack.EvDisconnect:
		p.mu.Lock()
		if p.g != nil {
			self := p.LocalAddress()
			p.leaveWait, p.leaveDone = map[stack.Address]bool{}, make(chan struct{})
			for a, m := range p.g.members {
				// Not a member that has left (its LEAVE came): it may
				// have stopped.
				if a != self && !m.deleted && !m.leave && (p.view == nil || p.view.Contains(a)) {
					p.leaveWait[a] = true
				}
			}
			if len(p.leaveWait) == 0 {
				close(p.leaveDone)
			}
			done := p.leaveDone
			p.g.leaveAll()
			out := p.takeOut()
			p.g = nil
			p.mu.Unlock()
			p.sendOut(out)
			// Stopped at once, the stack could no longer resend a LEAVE
			// that was lost, nor a message before it that a member still
			// misses: the members would not learn the sync point (and
			// that this member left rather than crashed). So the stack
			// stays up until every member has confirmed the LEAVE, which
			// it does once it has everything before it, or has gone from
			// the view (a crashed member is removed by failure
			// detection), or ctx ends, or max_leave_wait has passed (a
			// member that stopped is waited for no longer, also in a
			// stack without failure detection). Reliable unicast resends a lost
			// LEAVE only when it notices; this member sends it again
			// itself, every leave_timeout/8, to the members that have not
			// confirmed it. A leave that takes longer than leave_timeout
			// is counted (leaves_slow).
			t := time.NewTimer(p.cfg.LeaveTimeout)
			tick := time.NewTicker(p.cfg.LeaveTimeout / 8)
			limit := time.NewTimer(p.cfg.MaxLeaveWait)
			defer limit.Stop()
		wait:
			for {
				select {
				case <-done:
					break wait
				case <-t.C:
					p.leaveSlow.Add(1)
					p.Log().Info("groupfc: waiting for members to confirm the LEAVE", "members", p.awaited(), "leave_timeout", p.cfg.LeaveTimeout)
				case <-limit.C:
					p.leaveUnacked.Add(1)
					p.Log().Warn("groupfc: leaving without every member's confirmation", "members", p.awaited(), "max_leave_wait", p.cfg.MaxLeaveWait)
					break wait
				case <-ctx.Done():
					p.leaveUnacked.Add(1)
					break wait
				case <-tick.C:
					var again []protoMsg
					p.mu.Lock()
					for _, o := range out {
						if o.h.Type == typeLeave && p.leaveWait[o.to] {
							again = append(again, o)
						}
					}
					p.mu.Unlock()
					p.sendOut(again)
				}
			}
			t.Stop()
			tick.Stop()
		} else {
			p.mu.Unlock()
		}
	}
	return p.PassDownEvent(ctx, ev)
}

// Start makes the group: a peer's JOIN may come before this member's
// first view.
func (p *GROUPFC) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	self := p.LocalAddress()
	p.g = newGroup(self, p.cfg.Instance, p.cfg.Loopback, p.cfg.MemberEvents, p.cfg.MaxActive)
	p.g.maxUnread = int(p.cfg.MaxUnread / blockSize)
	if p.Log().Enabled(context.Background(), slog.LevelDebug) {
		p.g.trace = p.Log().Debug
	}
	p.leaveWait, p.leaveDone = nil, nil
	p.g.mandatory = true
	if p.cfg.Loopback {
		me := p.g.create(self, Joined)
		me.instance = p.cfg.Instance
	}
	return nil
}

func (p *GROUPFC) viewChange(v *stack.View) {
	self := p.LocalAddress()
	p.mu.Lock()
	if p.g == nil {
		// Leaving: a member that is no longer in the view will not
		// confirm the LEAVE.
		for a := range p.leaveWait {
			if !v.Contains(a) {
				p.unawait(a)
			}
		}
		p.mu.Unlock()
		return
	}
	p.g.joined = true
	p.view = v
	g := p.g
	for _, a := range v.Members {
		if a != self {
			g.published(a)
		}
	}
	var gone []*member
	for a, m := range g.members {
		// A JOINING member was never in a view here (its JOIN came
		// first): it is waited for, not withdrawn, or its JOIN would be
		// lost when the view that has it comes.
		if a != self && !v.Contains(a) && m.state != Joining {
			g.withdrawn(a, p.downs[a])
			delete(p.downs, a)
			if !m.deleted {
				gone = append(gone, m)
			}
		}
	}
	// Not delivered here (afterLocked never delivers on its caller): this
	// runs on GMS's view installation, which must never wait for the
	// application (a slow Receive held every later view behind it).
	p.afterLocked()
	for _, m := range gone {
		// A leaver delivers what it sent below its LEAVE's sync point; a
		// LEAVE or message that never comes is given up after
		// leave_timeout, and DOWN follows.
		p.Go(func(done <-chan struct{}) {
			t := time.NewTimer(p.cfg.LeaveTimeout)
			defer t.Stop()
			select {
			case <-t.C:
			case <-done:
				return
			}
			p.mu.Lock()
			if p.g == nil || m.deleted {
				p.mu.Unlock()
				return
			}
			p.g.lost(m)
			p.afterLocked()
		})
	}
}

// UpEvent notes suspected members: when the view drops them, their node is
// down and no LEAVE is awaited.
func (p *GROUPFC) UpEvent(ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		// Above the membership layer, which passes views up.
		if v := e.View; v != nil {
			p.viewChange(v)
		}
	case stack.EvSuspect:
		as := e.Members
		p.mu.Lock()
		for _, a := range as {
			p.downs[a] = true
		}
		p.mu.Unlock()
	case stack.EvUnsuspect:
		if a := e.Member; !a.IsZero() {
			p.mu.Lock()
			delete(p.downs, a)
			p.mu.Unlock()
		}
	}
	return p.PassUpEvent(ev)
}
