package gms

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- joining and leaving

// DownEvent joins on CONNECT and leaves on DISCONNECT.
func (g *GMS) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvConnect, stack.EvConnectWithState:
		if _, err := g.PassDownEvent(ctx, ev); err != nil {
			return stack.Answer{}, err
		}
		_, state := e.(stack.EvConnectWithState)
		g.joinWithState.Store(state)
		return stack.Answer{}, g.join(ctx)
	case stack.EvDisconnect:
		g.leave(ctx)
	}
	return g.PassDownEvent(ctx, ev)
}

func (g *GMS) join(ctx context.Context) error {
	self := g.LocalAddress()
	attempts := 0
	giveUp := func(why string) bool {
		attempts++
		if g.cfg.MaxJoinAttempts > 0 && attempts >= g.cfg.MaxJoinAttempts {
			g.Log().Warn("could not join a coordinator; starting a group of one", "attempts", attempts, "reason", why)
			return true
		}
		return false
	}
	var coord stack.Address
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if g.Stopped() {
			return stack.ErrClosed
		}
		if coord.IsZero() {
			infos, err := g.discover(ctx)
			if err != nil {
				return err
			}
			var first bool
			coord, first = pickCoord(self, infos)
			if first {
				if len(infos) > 0 {
					g.Log().Info("no coordinator among the members found; this member has the lowest address and starts the group", "found", len(infos))
				}
				return g.becomeSingleton()
			}
			if coord.IsZero() {
				// Others are joining too and one of them will start the group.
				if giveUp("no coordinator answered") {
					return g.becomeSingleton()
				}
				if !sleep(ctx.Done(), g.backoff()) {
					return ctx.Err()
				}
				continue
			}
		}
		rsp, err := g.askToJoin(ctx, coord)
		if err != nil {
			return err
		}
		act, next := onJoinRsp(self, rsp)
		switch act {
		case joinRetry:
			g.Log().Info("join attempt timed out", "coordinator", coord, "join_timeout", g.cfg.JoinTimeout)
		case joinRefused:
			g.Log().Warn("join refused", "by", coord, "reason", rsp.refused)
			return fmt.Errorf("gms: join refused by %s: %w", coord, rsp.refused)
		case joinRedirected:
			g.Log().Debug("join refused", "by", coord, "reason", rsp.Fail, "ask", rsp.Coord)
			if next.IsZero() && !sleep(ctx.Done(), g.backoff()) {
				return ctx.Err()
			}
		case joinJoined:
			// Replaces whatever view this member has, in one step: a view
			// set to nil first would be seen, for a moment, by the
			// coordinator's handler and the other layers.
			g.installJoined(rsp.View, rsp.Digest)
			g.send(rsp.View.ID.Creator, &Header{Type: typeViewAck, ViewID: rsp.View.ID})
			if rsp.View.ID.Creator != coord {
				g.send(coord, &Header{Type: typeViewAck, ViewID: rsp.View.ID})
			}
			g.printJoined(rsp.View)
			return nil
		}
		coord = next
		if coord.IsZero() && giveUp("no answer from a coordinator") {
			return g.becomeSingleton()
		}
	}
}

func (g *GMS) backoff() time.Duration {
	return g.cfg.JoinTimeout/10 + g.Rand().Duration(g.cfg.JoinTimeout/5+1)
}

func (g *GMS) discover(ctx context.Context) ([]stack.MemberInfo, error) {
	infos, err := stack.Ask(ctx, g, stack.EvFindMembers{Timeout: g.cfg.DiscoveryTimeout, BreakOnCoord: true})
	if errors.Is(err, stack.ErrNotSupported) {
		return nil, nil // no discovery layer: this member starts the group
	}
	return infos, err
}

// pickCoord chooses whom to ask: the coordinator most members name,
// preferring members that say they are the coordinator. first reports that
// no member has a view and this member has the lowest address of all found,
// so it starts the group.
func pickCoord(self stack.Address, infos []stack.MemberInfo) (coord stack.Address, first bool) {
	votes := map[stack.Address]int{}
	claim := map[stack.Address]bool{}
	lowest := true
	for _, mi := range infos {
		if mi.Addr == self {
			continue
		}
		if mi.IsServer && !mi.Coord.IsZero() {
			votes[mi.Coord]++
			if mi.IsCoord() {
				claim[mi.Addr] = true
			}
		} else if mi.Addr.Compare(self) < 0 {
			lowest = false
		}
	}
	if len(votes) == 0 {
		return stack.Address{}, lowest
	}
	cands := make([]stack.Address, 0, len(votes))
	for a := range votes {
		if len(claim) == 0 || claim[a] {
			cands = append(cands, a)
		}
	}
	slices.SortFunc(cands, func(a, b stack.Address) int {
		if c := cmp.Compare(votes[b], votes[a]); c != 0 {
			return c
		}
		return a.Compare(b)
	})
	return cands[0], false
}

func (g *GMS) askToJoin(ctx context.Context, coord stack.Address) (*Header, error) {
	for {
		select {
		case <-g.joinRsp: // a stale answer of an earlier attempt
			continue
		default:
		}
		break
	}
	g.mu.Lock()
	g.askedCoord = coord
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.askedCoord = stack.Address{}
		g.mu.Unlock()
	}()
	g.send(coord, &Header{Type: typeJoinReq, State: g.joinWithState.Load()})
	t := time.NewTimer(g.cfg.JoinTimeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-g.Done():
			return nil, stack.ErrClosed
		case <-t.C:
			return nil, nil
		case rsp := <-g.joinRsp:
			if rsp.Fail == "" && (rsp.View == nil || !rsp.View.Contains(g.LocalAddress())) {
				continue
			}
			return rsp, nil
		}
	}
}

func (g *GMS) becomeSingleton() error {
	self := g.LocalAddress()
	v := stack.NewView(self, 1, self)
	g.install(v, nil)
	g.printJoined(v)
	return nil
}

func (g *GMS) printJoined(v *stack.View) {
	if g.cfg.PrintLocalAddr {
		g.Log().Info("joined", "member", g.LocalAddress(), "view", v.ID)
	}
}

// leave leaves the view gracefully: the coordinator installs a view without
// itself (the next member takes over); a participant asks the coordinator.
// Either way it waits at most leave_timeout.
func (g *GMS) leave(ctx context.Context) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	if v == nil || v.Size() < 2 || g.leaving {
		g.view = nil
		g.mu.Unlock()
		return
	}
	g.leaving = true
	coord := g.coordLocked()
	done := g.leaveDone
	g.mu.Unlock()
	if coord == self {
		g.enqueue(request{kind: reqLeave, addr: self})
	} else {
		g.send(coord, &Header{Type: typeLeaveReq})
	}
	timeout := g.cfg.LeaveTimeout
	if coord == self {
		// The coordinator leaves once every member has its last view (or
		// is suspected): gone earlier, it could no longer send the view
		// again, and a member that missed it would stay in the old view,
		// blocked by the flush, until MERGE3 finds it.
		timeout += g.cfg.MaxBundlingTime + g.cfg.MaxViewAckWait + 2*g.cfg.ViewAckTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.Log().Info("leaving without the coordinator's confirmation", "coordinator", coord, "leave_timeout", g.cfg.LeaveTimeout)
	case <-ctx.Done():
	}
	g.mu.Lock()
	g.view = nil
	g.mu.Unlock()
}
