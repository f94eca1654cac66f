package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// runJoin is one member of a run across processes or hosts (-join): it
// waits for -members members, the first in the view starts the run, the
// first -senders send, and this member reports what it received.
func runJoin(o perfOptions, stderr io.Writer) (*perfResult, error) {
	if o.mode == "anycast" {
		return nil, errors.New("-mode anycast is not supported with -join")
	}
	data, file, err := readConfig(o.config)
	if err != nil {
		return nil, err
	}
	sc, err := stack.ParseConfigVars(file, data, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	name := o.name
	if name == "" {
		h, _ := os.Hostname()
		name = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	start := make(chan struct{})
	pm := &perfMember{wake: make(chan struct{}, 1),
		oob: o.oob, joined: true, start: start, acks: map[int]int64{}, dones: map[int]uint64{}}
	pm.mu.Lock() // until this member knows its index
	ch, err := stack.New(withDiag(o.diag, stack.FromConfig(sc), stack.WithName(name), stack.WithReceiver(pm))...)
	if err != nil {
		pm.mu.Unlock()
		return nil, err
	}
	defer ch.Close()
	printDiag(stderr, ch)
	pm.ch = ch
	if err := pm.attachRPC(o); err != nil {
		pm.mu.Unlock()
		return nil, err
	}
	if pm.d != nil {
		defer pm.d.Close()
	}
	if err := ch.Connect(ctx, o.cluster); err != nil {
		pm.mu.Unlock()
		return nil, err
	}
	var members []stack.Address
	for {
		if v := ch.View(); v.Size() >= o.members {
			members = v.Members[:o.members]
			break
		}
		select {
		case <-ctx.Done():
			pm.mu.Unlock()
			return nil, fmt.Errorf("waiting for %d members: %w", o.members, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	pm.idx = slices.Index(members, ch.Address())
	pm.mu.Unlock()
	if pm.idx < 0 {
		return nil, fmt.Errorf("more than %d members joined %s", o.members, o.cluster)
	}
	if pm.idx == 0 {
		// Again and again until the run ends: a joiner whose join digest
		// was taken after the first GO would never get that one.
		goCtx, stopGo := context.WithCancel(ctx)
		defer stopGo()
		go func() {
			for goCtx.Err() == nil {
				_ = ch.Send(goCtx, stack.NewMessage(stack.Address{}, control(kindGo, 0, 0)))
				select {
				case <-goCtx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
	select {
	case <-start:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the first member to start: %w", ctx.Err())
	}
	n := len(members)
	var dests []int // the members this one sends to, by index
	var from []int  // the senders this one receives from
	for j := range n {
		switch o.mode {
		case "multicast":
			if j != pm.idx {
				dests = append(dests, j)
				if j < o.senders {
					from = append(from, j)
				}
			}
		case "unicast":
			if j == (pm.idx+1)%n {
				dests = append(dests, j)
			}
			if (j+1)%n == pm.idx && j < o.senders {
				from = append(from, j)
			}
		}
	}
	if o.warmup > 0 {
		// The uncounted round: this member sends and receives all of it,
		// then waits until every member has (round 0 done), so that the
		// measured round starts warm everywhere.
		var warmErr error
		if pm.idx < o.senders {
			warmErr = sendJoined(ctx, o, pm, members, dests, kindWarm, o.warmup, nil)
		}
		waitJoined(ctx, pm, from, kindWarm, o.warmup)
		for _, j := range from {
			if g := pm.received(kindWarm, j); g != int64(o.warmup) && warmErr == nil {
				warmErr = fmt.Errorf("got %d of member %d's %d messages", g, j, o.warmup)
			}
		}
		if warmErr != nil {
			return nil, fmt.Errorf("warm-up: %w", warmErr)
		}
		_ = ch.Send(ctx, stack.NewMessage(stack.Address{}, control(kindDone, pm.idx, 0)))
		if !waitDone(ctx, pm, n, 0) {
			return nil, fmt.Errorf("warm-up: not every member finished it: %w", ctx.Err())
		}
	}
	round, err := startRound(o)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	var lats []time.Duration
	var sendErr error
	if pm.idx < o.senders {
		sendErr = sendJoined(ctx, o, pm, members, dests, kindData, o.count, &lats)
	}
	waitJoined(ctx, pm, from, kindData, o.count)
	el := time.Since(t0)
	res := &perfResult{Config: file, Mode: o.mode, Members: n, Senders: o.senders, Size: o.size, Count: o.count, Warmup: o.warmup, Alloc: o.alloc, Seconds: el.Seconds(), Stats: map[string]int64{}}
	if err := round.finish(res, o.senders*o.count); err != nil {
		return nil, err
	}
	if o.mode == "rpc" {
		res.Latency = percentiles(lats)
		res.CallsPerS = float64(len(lats)) / el.Seconds()
	}
	if sendErr != nil {
		res.Errors = append(res.Errors, sendErr.Error())
	}
	pm.mu.Lock()
	res.Errors = append(res.Errors, pm.errs...)
	span := pm.last.Sub(pm.first).Seconds()
	pm.mu.Unlock()
	got := int64(0)
	for _, j := range from {
		g := pm.gotFrom(j)
		got += g
		if g != int64(o.count) {
			res.Errors = append(res.Errors, fmt.Sprintf("member %d (%s) got %d of member %d's %d messages", pm.idx, name, g, j, o.count))
		}
	}
	mr := memberResult{Member: pm.idx, Msgs: got}
	if span > 0 {
		mr.MsgsPerS, mr.MBPerS = float64(got)/span, float64(got)*float64(o.size)/span/1e6
	}
	res.PerMember, res.TotalMsgs = []memberResult{mr}, got
	res.MsgsPerS, res.MBPerS = mr.MsgsPerS, mr.MBPerS
	addStats(res.Stats, ch)
	// Stay until every member is done, so nobody's retransmissions are cut
	// short by an early leave.
	_ = ch.Send(ctx, stack.NewMessage(stack.Address{}, control(kindDone, pm.idx, 1)))
	waitDone(ctx, pm, n, 1)
	_ = ch.Disconnect(context.WithoutCancel(ctx))
	return res, nil
}

// waitJoined waits until pm has n messages of kind from each of from (or
// the run's timeout).
func waitJoined(ctx context.Context, pm *perfMember, from []int, kind byte, n int) {
	for _, j := range from {
		for pm.received(kind, j) < int64(n) && ctx.Err() == nil {
			select {
			case <-pm.wake:
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

// waitDone waits until all n members have said they finished round
// (kindDone); it reports whether they did before the run's timeout.
func waitDone(ctx context.Context, pm *perfMember, n int, round uint64) bool {
	for ctx.Err() == nil {
		pm.mu.Lock()
		all := 0
		for _, d := range pm.dones {
			if d > round {
				all++
			}
		}
		pm.mu.Unlock()
		if all >= n {
			return true
		}
		select {
		case <-pm.wake:
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false
}

// sendJoined sends this member's n messages (calls) of kind in -join mode,
// paced by the stack's flow control only; lats (nil: not kept) gets the
// calls' latencies.
func sendJoined(ctx context.Context, o perfOptions, pm *perfMember, members []stack.Address, dests []int, kind byte, n int, lats *[]time.Duration) error {
	a := newPerfAlloc(o)
	for s := range n {
		buf := a.payload(kind, pm.idx, uint64(s))
		if o.mode == "rpc" {
			to := members[(pm.idx+1+rand.IntN(len(members)-1))%len(members)]
			t0 := time.Now()
			if err := pm.call(ctx, to, buf, uint64(s)); err != nil {
				return err
			}
			if lats != nil {
				*lats = append(*lats, time.Since(t0))
			}
			continue
		}
		dest := stack.Address{}
		if o.mode == "unicast" {
			dest = members[dests[0]]
		}
		m := a.message(dest, buf)
		if o.oob {
			m.Set(stack.OOB)
		}
		if err := pm.ch.Send(ctx, m); err != nil {
			return err
		}
	}
	return nil
}
