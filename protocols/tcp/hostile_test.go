package tcp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// hello is a well-formed connection preamble claiming 127.0.0.1:port.
func hello(port uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte("STCP\x01\x04\x7f\x00\x00\x01"), port)
}

// attack dials victim, writes data, half-closes, and waits until the victim
// closes the connection.
func attack(t *testing.T, victim string, data []byte) {
	t.Helper()
	c, err := net.Dial("tcp4", victim)
	require.NoError(t, err)
	defer c.Close()
	_, _ = c.Write(data)
	_ = c.(*net.TCPConn).CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err = io.Copy(io.Discard, c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		require.NoError(t, err, "the victim closes the connection")
	}
}

// TestHostileFramesAreCountedAndCutOff: random bytes after a good
// preamble, truncated frames, frames above max_bundle_size, frames of
// garbage and bad preambles each cut the connection off and are counted
// once; the group keeps working throughout.
func TestHostileFramesAreCountedAndCutOff(t *testing.T) {
	stacktest.CheckLeaks(t)
	ms := startMembers(t, 2, "hostile", testConfig(), nil)
	a, victim := ms[0], ms[1]
	to := victim.tcp.PhysicalAddress().String()
	rng := rand.New(rand.NewPCG(stacktest.Seed(t), 2))
	fill := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	const each = 50
	var sent int
	keepWorking := func() {
		t.Helper()
		sent++
		require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(victim.ch.Address(), stacktest.Payload(0, sent-1, 100))))
		stacktest.WaitFor(t, wait, func() bool { return victim.col.Len() == sent }, "the group keeps working")
	}
	frame := func(n uint32, body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(hello(1), n), body...)
	}
	cases := []struct {
		name string
		gen  func() []byte
	}{
		{"random bytes", func() []byte { return append(hello(1), fill(5+rng.IntN(2000))...) }},
		{"truncated", func() []byte { n := 10 + rng.IntN(1000); return frame(uint32(n), fill(rng.IntN(n))) }},
		{"oversized", func() []byte { return frame(64001+uint32(rng.IntN(1<<30)), fill(rng.IntN(100))) }},
		{"empty", func() []byte { return frame(0, nil) }},
		{"garbage bundle", func() []byte { n := 1 + rng.IntN(1000); return frame(uint32(n), fill(n)) }},
	}
	for i, c := range cases {
		for range each {
			attack(t, to, c.gen())
		}
		require.EqualValues(t, (i+1)*each, stacktest.Stat(t, victim.tcp, "bad_frames"), "after %s", c.name)
		keepWorking()
	}
	for range each {
		attack(t, to, fill(1+rng.IntN(100)))
	}
	require.EqualValues(t, each, stacktest.Stat(t, victim.tcp, "bad_preambles"))
	keepWorking()
	require.Empty(t, victim.col.CheckExactlyOnce([]stack.Address{a.ch.Address()}, sent, true))
}

// halfOpen is how many idle connections TestHalfOpenConnectionsAreCounted
// opens, in waves of at most halfOpenWave at once (both ends of each are in
// this process, whose file descriptors are limited: 20,000 here). The
// issue asks for 100,000; CI runs 4,000, and STRATA_HALF_OPEN=100000 runs
// them all (about 15 s).
const (
	halfOpen     = 4000
	halfOpenWave = 4000
)

// TestHalfOpenConnectionsAreCounted: connections that never send a
// preamble are closed after peer_addr_read_timeout, those beyond
// max_pending_connections at once, each counted; meanwhile the group keeps
// working.
func TestHalfOpenConnectionsAreCounted(t *testing.T) {
	stacktest.CheckLeaks(t)
	cfg := testConfig()
	cfg.PeerTimeout = 300 * time.Millisecond
	cfg.MaxPending = 500
	ms := startMembers(t, 2, "halfopen", cfg, nil)
	a, victim := ms[0], ms[1]
	to := victim.tcp.PhysicalAddress().String()
	total := halfOpen
	if s := os.Getenv("STRATA_HALF_OPEN"); s != "" {
		var err error
		total, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	sent, opened, failed := 0, 0, 0
	counted := func() int64 {
		return stacktest.Stat(t, victim.tcp, "preamble_timeouts") + stacktest.Stat(t, victim.tcp, "refused_too_many_pending")
	}
	for left := total; left > 0; left -= halfOpenWave {
		n := min(left, halfOpenWave)
		var mu sync.Mutex
		var conns []net.Conn
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < n; i += 16 {
					c, err := net.Dial("tcp4", to)
					mu.Lock()
					if err != nil {
						failed++
					} else {
						conns = append(conns, c)
					}
					mu.Unlock()
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for busy := true; busy; {
			select {
			case <-done:
				busy = false
			default:
			}
			require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(victim.ch.Address(), stacktest.Payload(0, sent, 100))))
			sent++
			stacktest.WaitFor(t, wait, func() bool { return victim.col.Len() == sent }, "the group keeps working during the flood")
		}
		opened += len(conns)
		stacktest.WaitFor(t, wait, func() bool { return counted() == int64(opened) }, "every idle connection is counted")
		for _, c := range conns {
			_ = c.Close()
		}
	}
	t.Logf("%d idle connections opened (%d dials failed), %d timed out, %d refused at once; %d messages during the flood",
		opened, failed, stacktest.Stat(t, victim.tcp, "preamble_timeouts"), stacktest.Stat(t, victim.tcp, "refused_too_many_pending"), sent)
	require.Positive(t, stacktest.Stat(t, victim.tcp, "refused_too_many_pending"))
	require.Positive(t, stacktest.Stat(t, victim.tcp, "preamble_timeouts"))
	require.Zero(t, stacktest.Stat(t, victim.tcp, "pending_connections"))
	require.EqualValues(t, 1, stacktest.Stat(t, victim.tcp, "sockets_open"), "only the member's connection is left")
	require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(victim.ch.Address(), stacktest.Payload(0, sent, 100))))
	sent++
	stacktest.WaitFor(t, wait, func() bool { return victim.col.Len() == sent }, "the group works after the flood")
	require.Empty(t, victim.col.CheckExactlyOnce([]stack.Address{a.ch.Address()}, sent, true))
}
