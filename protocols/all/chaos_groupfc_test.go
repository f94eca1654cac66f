package all_test

import (
	"fmt"
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
	// A member that went is DOWN everywhere within leave_timeout (its
	// LEAVE, or the view, and then the time given to its last messages).
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
	r.check()
}

// checkGroup checks GROUPFC's promises at every member that stayed:
//   - member events come in order with the messages: from each member, at
//     most one UP, before any of its messages; at most one DOWN, after an
//     UP and after its last message;
//   - a survivor that crashed or left is DOWN at every survivor, with
//     Graceful set only for the one that left;
//   - every message a survivor sent to another survivor after it had seen
//     that member UP is delivered.
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
			ups, downs := 0, 0
			for x, s := range seq {
				switch s {
				case "UP":
					ups++
					r.require(ups == 1 && x == 0, "member %s: %s UP twice or after its messages: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
				case "DOWN", "DOWN(left)":
					downs++
					r.require(downs == 1 && ups == 1 && x == len(seq)-1, "member %s: %s DOWN twice, without UP or before a message: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
				default:
					r.require(ups == 1, "member %s: a message from %s before its UP: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
				}
			}
			if r.dead[j] && ups == 1 {
				how := "crashed"
				if j == r.leaver {
					how = "left"
				}
				r.require(downs == 1, "member %s: %s %s but is never DOWN: %v", stacktest.Names[i], stacktest.Names[j], how, abbreviate(seq))
				want := map[bool]string{true: "DOWN(left)", false: "DOWN"}[j == r.leaver]
				r.require(seq[len(seq)-1] == want, "member %s: %s %s, but its event is %s", stacktest.Names[i], stacktest.Names[j], how, seq[len(seq)-1])
			}
			if !r.dead[j] {
				r.require(ups == 1 && downs == 0, "member %s: %s stays but is not UP: %v", stacktest.Names[i], stacktest.Names[j], abbreviate(seq))
			}
		}
	}
	for _, m := range r.sent {
		if r.dead[m.sender] {
			continue
		}
		for _, to := range live {
			if to == m.sender || m.kind == kindUcast && to != m.to || m.ups&(1<<to) == 0 {
				continue
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
