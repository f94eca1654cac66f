package all_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestChaosGroupFC is scenario C: five members of groupfc.toml with member
// events, 10% loss, duplication and reordering, one slow receiver (each
// delivery takes 50ms while the traffic runs, so its windows fill and the
// senders block), six flow-controlled senders (the five and a late
// joiner), a crash and a graceful leave. Besides the suite's invariants
// (without the views' delivery rule) it checks GROUPFC's promises: see
// checkGroup.
func TestChaosGroupFC(t *testing.T) {
	skipShort(t)
	for _, seed := range chaosSeeds(t, "1-100") {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { scenarioC(t, seed) })
		})
	}
}

func scenarioC(t *testing.T, seed uint64) {
	const n = 5
	r := newChaosRun(t, "groupfc.toml", seed)
	r.groupfc = true
	inst := uint64(0)
	r.prepare = func(ch *stack.Channel) {
		mustGroupFC(ch).SetIdentity(groupfc.Identity{Instance: inst % 2, Loopback: true, MemberEvents: true}) // loopback: a sender gets its own broadcasts
		inst++
	}
	r.start(n)
	defer r.close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.stopAll()

	slow := r.rng.IntN(n)
	r.recs[slow].slow.Store(int64(50 * time.Millisecond))
	r.faultsAndTraffic(0.1, &wg)

	// The late joiner, the sixth sender.
	j := r.add()
	r.require(r.chs[j].Connect(t.Context(), "chaos") == nil, "the joiner could not join")
	r.traffic(j, &wg)
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView(r.alive()) }), "the joiner is not in everyone's view")
	time.Sleep(2 * time.Second)

	var others []int
	for _, i := range r.alive() {
		if i != slow {
			others = append(others, i)
		}
	}
	victim := others[r.rng.IntN(len(others))]
	r.crash(victim)
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView(r.alive()) }), "the crash of %s was not noticed", stacktest.Names[victim])
	time.Sleep(time.Second)

	live := r.alive()
	leaver := live[r.rng.IntN(len(live))]
	r.leaver = leaver
	r.leave(leaver)
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView(r.alive()) }), "%s's leave did not end in one view", stacktest.Names[leaver])

	r.stopAll()
	wg.Wait()
	r.recs[slow].slow.Store(0)
	r.net.SetDefault(sim.Rule{})
	r.settle()
	r.requireDownEverywhere()
	r.check()
}

// requireDownEverywhere waits until a member that went is DOWN at every
// survivor: within leave_timeout (its LEAVE, or the view, and then the
// time given to its last messages).
func (r *chaosRun) requireDownEverywhere() {
	r.t.Helper()
	r.require(waitUntil(time.Minute, func() bool {
		for _, i := range r.alive() {
			rec := r.recs[i]
			rec.mu.Lock()
			for j, ch := range r.chs {
				seq := rec.bySrc[ch.Address()]
				if r.dead[j] && len(seq) > 0 && !strings.HasPrefix(seq[len(seq)-1], "DOWN") {
					rec.mu.Unlock()
					return false
				}
			}
			rec.mu.Unlock()
		}
		return true
	}), "a member that went is not DOWN everywhere after a minute")
}

// checkGroup checks GROUPFC's promises at every member that stayed:
//   - member events come in order with the messages: from each member, UP
//     and DOWN alternate, starting with UP, and its messages come only
//     while it is UP (a member left out of a view and merged back is DOWN
//     and UP again: a new incarnation);
//   - a survivor that crashed or left is DOWN at every survivor in the
//     end, with Graceful set only for the one that left, and set for it
//     at the members it left (leftTo: the others may have lost it before,
//     in another subgroup); a member that stays is UP at every survivor in
//     the end;
//   - every message a survivor sent to another survivor while it saw that
//     member UP is delivered, unless the sender saw it DOWN afterwards
//     (that incarnation ended: its undelivered messages went with it).
func (r *chaosRun) checkGroup() {
	r.t.Helper()
	live := r.alive()
	for _, i := range live {
		rec := r.recs[i]
		rec.mu.Lock()
		bySrc := map[stack.Address][]string{}
		for a, seq := range rec.bySrc {
			bySrc[a] = append([]string(nil), seq...)
		}
		rec.mu.Unlock()
		for j, ch := range r.chs {
			if j == i {
				continue
			}
			seq := bySrc[ch.Address()]
			up, ups := false, 0
			for _, s := range seq {
				switch s {
				case "UP":
					r.require(!up, "member %s: %s UP twice without a DOWN between: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
					up = true
					ups++
				case "DOWN", "DOWN(left)":
					r.require(up, "member %s: %s DOWN while not UP: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
					up = false
				default:
					r.require(up, "member %s: a message from %s while it is not UP: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
				}
			}
			if r.dead[j] && ups > 0 {
				how := "crashed"
				if j == r.leaver {
					how = "left"
				}
				r.require(!up, "member %s: %s %s but is never DOWN: %v", stacktest.Names[i], stacktest.Names[j], how, abbreviate(seq))
				last := seq[len(seq)-1]
				switch {
				case j != r.leaver:
					r.require(last == "DOWN", "member %s: %s %s, but its event is %s", stacktest.Names[i], stacktest.Names[j], how, last)
				case r.leftTo[i]:
					r.require(last == "DOWN(left)", "member %s: %s %s, but its event is %s", stacktest.Names[i], stacktest.Names[j], how, last)
				}
			}
			if !r.dead[j] {
				r.require(up, "member %s: %s stays but is not UP: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
			}
		}
	}
	downsAt := map[int]map[stack.Address]int{}
	for _, i := range live {
		rec := r.recs[i]
		rec.mu.Lock()
		downsAt[i] = maps.Clone(rec.downs)
		rec.mu.Unlock()
	}
	for _, m := range r.sent {
		if r.dead[m.sender] {
			continue
		}
		for _, to := range live {
			if to == m.sender || m.kind == kindUcast && to != m.to || m.ups&(1<<to) == 0 {
				continue
			}
			if to < len(m.downs) && downsAt[m.sender][r.chs[to].Address()] > m.downs[to] {
				continue // the sender saw it DOWN since: that incarnation ended
			}
			r.require(r.has(to, streamKey{m.sender, m.kind, m.to}, m.seq), "member %s never delivered %d/%d/%d#%d, sent after %s was UP at its sender",
				stacktest.Names[to], m.sender, m.kind, m.to, m.seq, stacktest.Names[to])
		}
	}
}

// abbreviate shortens a member's event and message sequence for a message.
func abbreviate(seq []string) []string {
	var out []string
	n := 0
	flush := func() {
		if n > 0 {
			out = append(out, fmt.Sprintf("%d msgs", n))
			n = 0
		}
	}
	for _, s := range seq {
		if s == "msg" {
			n++
			continue
		}
		flush()
		out = append(out, s)
	}
	flush()
	return out
}

// TestChaosGroupFCColdStart is scenario E: eight members of groupfc.toml
// with member events. Seven start at the same moment under 20% loss (so
// they often form subgroups that merge), an eighth joins late, one
// receiver is slow (10ms per delivery). Every other member sends 80
// messages, half broadcasts and half unicasts to the slow receiver: 5%
// between 60,001 bytes and GROUPFC's limit (fragmented), 10% of 3-20 KB,
// the rest of 100-3,100 bytes. A crash comes 2-5 s after the late join and
// a graceful leave 2-5 s after that, without waiting for the views to
// settle. GROUPFC's promises are checked as in scenario C (checkGroup),
// across the merges; a failure report shows every member's GROUPFC states,
// next broadcast seqno and queue head.
func TestChaosGroupFCColdStart(t *testing.T) {
	skipShort(t)
	for _, seed := range chaosSeeds(t, "1-100") {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { scenarioE(t, seed) })
		})
	}
}

func scenarioE(t *testing.T, seed uint64) {
	const n = 7
	r := newChaosRun(t, "groupfc.toml", seed)
	r.groupfc = true
	inst := uint64(0)
	r.prepare = func(ch *stack.Channel) {
		mustGroupFC(ch).SetIdentity(groupfc.Identity{Instance: inst % 2, Loopback: true, MemberEvents: true})
		inst++
	}
	for range n {
		r.add()
	}
	defer r.close()
	slow := r.rng.IntN(n)
	r.recs[slow].slow.Store(int64(10 * time.Millisecond))
	r.net.SetDefault(sim.Rule{Drop: 0.2})

	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.stopAll()
	errs := make(chan error, n)
	for i, ch := range r.chs {
		go func() {
			err := ch.Connect(t.Context(), "chaos")
			if err == nil && i != slow {
				r.groupTraffic(i, slow, &wg)
			}
			errs <- err
		}()
	}
	for range n {
		err := <-errs
		r.require(err == nil, "Connect: %v", err)
	}
	j := r.add()
	r.require(r.chs[j].Connect(t.Context(), "chaos") == nil, "the late joiner could not join")
	r.groupTraffic(j, slow, &wg)

	time.Sleep(2*time.Second + time.Duration(r.rng.IntN(3000))*time.Millisecond)
	var others []int
	for _, i := range r.alive() {
		if i != slow {
			others = append(others, i)
		}
	}
	victim := others[r.rng.IntN(len(others))]
	r.crash(victim)
	time.Sleep(2*time.Second + time.Duration(r.rng.IntN(3000))*time.Millisecond)
	others = slices.DeleteFunc(others, func(i int) bool { return i == victim })
	r.leaver = others[r.rng.IntN(len(others))]
	r.leave(r.leaver)

	wg.Wait() // every sender sent its 80 messages (each send has a deadline)
	r.require(waitUntil(10*time.Minute, func() bool { return r.sameView(r.alive()) }), "no common view of the survivors after 10 minutes")
	r.recs[slow].slow.Store(0)
	r.net.SetDefault(sim.Rule{})
	r.settle()
	r.requireDownEverywhere()
	r.check()
}

// groupTraffic has member i send 80 messages, half broadcasts and half
// unicasts to member to, of scenario E's sizes, one every 50-150ms.
func (r *chaosRun) groupTraffic(i, to int, wg *sync.WaitGroup) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(i)+1))
	stop := r.stops[i]
	wg.Go(func() {
		for k := range 80 {
			select {
			case <-stop:
				return
			case <-time.After(50*time.Millisecond + time.Duration(rng.IntN(100))*time.Millisecond):
			}
			size := 100 + rng.IntN(3000)
			switch x := rng.IntN(100); {
			case x < 5:
				size = 60_001 + rng.IntN(groupfc.MaxMessageSize-60_000)
			case x < 15:
				size = 3_000 + rng.IntN(17_000)
			}
			if k%2 == 0 {
				r.send(i, kindMcast, 0, size)
			} else {
				r.send(i, kindUcast, to, size)
			}
		}
	})
}
