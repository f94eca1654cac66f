package all_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
)

// carriesData lists the headers of protocols that carry application data
// in the payload: a message with one of them and a payload is application
// traffic (or the application's state) and may go on the regular or OOB
// lane. Their other messages, like every other protocol message, are the
// protocol's own and must be INTERNAL.
var carriesData = map[uint16]string{
	stack.IDFRAG:          "a fragment of an application message",
	stack.IDCOMPRESS:      "a compressed application message",
	stack.IDGROUPFC:       "a group unicast, anycast, multicast or broadcast",
	stack.IDStateTransfer: "a chunk of the application's state",
}

// sequencing lists the headers that every reliable message carries, the
// protocol's own and the application's alike; they are reported only on a
// message that has no other header.
var sequencing = map[uint16]bool{stack.IDNAKACK: true, stack.IDUNICAST2: true}

// notShipped lists registered headers of protocols that no shipped stack
// over SIM exchanges: test tools, and the transports (whose own headers
// never leave them).
var notShipped = map[uint16]string{
	stack.IDSIM:        "transport",
	stack.IDUDP:        "transport",
	stack.IDDISCARD:    "test tool",
	stack.IDDELAY:      "test tool",
	stack.IDStaticPING: "udp-nomcast.toml only (fixed member addresses); it sends through PING's code, which sets INTERNAL",
	stack.IDDNSPing:    "kubernetes.toml only (a DNS name); it sends through PING's code, which sets INTERNAL",
	stack.IDTCP:        "transport",
	stack.IDENCRYPT:    "secure.toml only; it wraps whole messages below the other protocols",
	stack.IDAUTH:       "secure.toml only; it adds its header to GMS's messages",
	stack.IDCOMPRESS:   "secure.toml only; it carries application data",
}

// headerSpy records, per protocol header id, the kinds of messages seen
// going down to the transport, and the ones that were not INTERNAL although
// they carry no application payload.
type headerSpy struct {
	mu    sync.Mutex
	seen  map[uint16]bool
	wrong map[string]int // "<protocol> <header>" -> count
}

func newHeaderSpy() *headerSpy {
	return &headerSpy{seen: map[uint16]bool{}, wrong: map[string]int{}}
}

func (s *headerSpy) observe(m *stack.Message) bool {
	names := stack.HeaderIDs()
	s.mu.Lock()
	defer s.mu.Unlock()
	data := parseChaos(m.Payload).ok
	m.EachHeader(func(id uint16, h stack.Header) {
		s.seen[id] = true
		if _, ok := carriesData[id]; ok && len(m.Payload) > 0 {
			data = true
		}
	})
	if data || m.Has(stack.Internal) {
		return false
	}
	var own []string
	m.EachHeader(func(id uint16, h stack.Header) {
		if !sequencing[id] || m.NumHeaders() == 1 {
			own = append(own, fmt.Sprintf("%s %s", names[id], kindOf(h)))
		}
	})
	for _, k := range own {
		s.wrong[k]++
	}
	return false // never drops
}

// kindOf names a header's message type for the report: its Kind() if it
// has one, else its type and value.
func kindOf(h stack.Header) string {
	if k, ok := h.(interface{ Kind() string }); ok {
		return k.Kind()
	}
	s := fmt.Sprintf("%T %v", h, h)
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

// TestProtocolMessagesAreInternal walks every registered header type: each
// shipped stack runs over SIM through loss, a partition and merge, a
// crash, a join (with a state transfer and an application flush on
// flush.toml) and a graceful leave, with application traffic all along,
// and a spy just above the transport looks at every message sent. A
// message that carries no application payload must be INTERNAL, so a
// protocol's control traffic is never queued behind application messages
// (JGroups' seed bugs). Every registered header must have been seen, or be
// listed as carrying application data or not exchanged in these stacks.
func TestProtocolMessagesAreInternal(t *testing.T) {
	skipShort(t)
	seen := map[uint16]bool{}
	var mu sync.Mutex
	for _, file := range []string{"udp.toml", "flush.toml", "groupfc.toml"} {
		t.Run(file, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				spy := newHeaderSpy()
				controlWorkload(t, file, spy)
				mu.Lock()
				maps.Copy(seen, spy.seen)
				mu.Unlock()
				spy.mu.Lock()
				defer spy.mu.Unlock()
				require.Empty(t, spy.wrong, "protocol messages sent on the regular or OOB lane (protocol, message type: count)")
			})
		})
	}
	var missing []string
	for id, name := range stack.HeaderIDs() {
		if _, ok := notShipped[id]; !ok && !seen[id] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "registered headers the workload never sent: list them in notShipped with the reason, or exercise them")
}

// controlWorkload runs file's stack through what makes every protocol
// talk, with spy watching each member's messages above the transport.
func controlWorkload(t *testing.T, file string, spy *headerSpy) {
	const n = 4
	r := newChaosRun(t, file, 7)
	r.groupfc = file == "groupfc.toml"
	r.prepare = func(ch *stack.Channel) {
		d := discard.New(discard.DefaultConfig())
		d.DropDownIf(spy.observe)
		require.NoError(t, stack.Of(ch).InsertAbove(d, "SIM"))
		if r.groupfc {
			mustGroupFC(ch).SetIdentity(groupfc.Identity{Loopback: true, MemberEvents: true})
		}
	}
	r.start(n)
	defer r.close()
	for i := range r.chs {
		r.chs[i].SetReceiver(stateful{r.recs[i]})
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.stopAll()
	r.faultsAndTraffic(0.1, &wg)

	r.net.Partition(r.addrs([]int{0}), r.addrs([]int{1, 2, 3}))
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView([]int{1, 2, 3}) && r.chs[0].View().Size() == 1 }), "the partition did not split the views")
	r.net.Heal()
	r.require(waitUntil(5*time.Minute, func() bool { return r.sameView(r.alive()) }), "no merge view after the partition healed")

	r.crash(1)
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView(r.alive()) }), "the crash was not noticed")

	j := r.add()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if strings.Contains(file, "flush") {
		r.chs[j].SetReceiver(stateful{r.recs[j]})
		r.require(r.chs[j].ConnectWithState(ctx, "chaos", stack.Address{}) == nil, "the joiner could not join with state")
		r.require(r.chs[2].StartFlush(ctx) == nil, "StartFlush")
		r.require(r.chs[2].StopFlush(ctx) == nil, "StopFlush")
	} else {
		r.require(r.chs[j].Connect(ctx, "chaos") == nil, "the joiner could not join")
	}
	r.traffic(j, &wg)
	if !r.groupfc {
		// 2.4 MB from one member to another: UFC's credits run low.
		for range 40 {
			r.require(r.send(0, kindUcast, 3, 60_000) == nil, "a large unicast")
		}
	}
	time.Sleep(2 * time.Second)
	r.leave(2)
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView(r.alive()) }), "the leave did not end in one view")
	r.stopAll()
	wg.Wait()
	r.net.SetDefault(sim.Rule{})
	// The periodic protocols speak on the quiet group too.
	r.require(waitUntil(time.Minute, func() bool {
		spy.mu.Lock()
		defer spy.mu.Unlock()
		return spy.seen[stack.IDSTABLE] && spy.seen[stack.IDMERGE3] && spy.seen[stack.IDFDALL]
	}), "STABLE, MERGE3 and FD_ALL spoke")
}
