package tcp_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestFourMembersOnTCPConfigCarryEverythingOnOneConnectionPerPeer: four
// members on the shipped tcp.toml, found through STATIC_PING, form one view
// and carry multicasts and unicasts with no loss, no duplicates, in order,
// each over one connection per peer.
func TestFourMembersOnTCPConfigCarryEverythingOnOneConnectionPerPeer(t *testing.T) {
	stacktest.CheckLeaks(t)
	const n, per = 4, 300
	port := freeTCPPort(t)
	vars := map[string]string{
		"STRATA_BIND_PORT":       strconv.Itoa(port),
		"STRATA_INITIAL_HOSTS":   fmt.Sprintf("127.0.0.1:%d", port),
		"STRATA_PING_PORT_RANGE": "6",
	}
	fsys := configFS(t, "tcp.toml")
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i := range n {
		ch, col := startFromConfig(t, fsys, "tcp.toml", stacktest.Names[i], vars)
		chs, cols = append(chs, ch), append(cols, col)
	}
	errs := make(chan error, n)
	for _, ch := range chs {
		go func() { errs <- ch.Connect(context.Background(), "tcp4") }()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	stacktest.WaitForSameView(t, 2*time.Minute, chs...)
	addrs := make([]stack.Address, n)
	for i, ch := range chs {
		addrs[i] = ch.Address()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, ch := range chs {
		wg.Go(func() {
			for seq := range per {
				if !assert.NoError(t, ch.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(i, seq, 1000)))) {
					return
				}
			}
		})
	}
	wg.Wait()
	for i, col := range cols {
		stacktest.WaitFor(t, wait, func() bool { return col.Len() >= n*per }, "member %d gets every multicast", i)
		require.Empty(t, col.CheckExactlyOnce(addrs, per, true))
		col.Reset()
	}
	for i, ch := range chs {
		wg.Go(func() {
			for j := range n {
				if j == i {
					continue
				}
				for seq := range per {
					if !assert.NoError(t, ch.Send(ctx, stack.NewMessage(addrs[j], stacktest.Payload(i, seq, 1000)))) {
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for j, col := range cols {
		others := append(append([]stack.Address{}, addrs[:j]...), addrs[j+1:]...)
		stacktest.WaitFor(t, wait, func() bool { return col.Len() >= (n-1)*per }, "member %d gets every unicast", j)
		require.Empty(t, col.CheckExactlyOnce(others, per, true))
	}
	for i, ch := range chs {
		tp := transportOf(ch)
		stacktest.WaitFor(t, wait, func() bool {
			return tp.Connections() == n-1 && stacktest.Stat(t, tp, "sockets_open") == n-1
		}, "member %d ends with one connection per peer (has %d, %d sockets)", i, tp.Connections(), stacktest.Stat(t, tp, "sockets_open"))
		require.Zero(t, stacktest.Stat(t, tp, "bad_frames"))
		require.Zero(t, stacktest.Stat(t, tp, "dropped_peer_queue_full"))
	}
}

// TestKilledMemberIsExcludedAndRestartOnSamePortRejoins: a member whose
// sockets all close at once (as when its process is killed: its peers'
// connections reset) is excluded; a new member on the same port joins the
// group and exchanges messages with it.
func TestKilledMemberIsExcludedAndRestartOnSamePortRejoins(t *testing.T) {
	stacktest.CheckLeaks(t)
	port := freeTCPPort(t)
	vars := map[string]string{
		"STRATA_BIND_PORT":       strconv.Itoa(port),
		"STRATA_INITIAL_HOSTS":   fmt.Sprintf("127.0.0.1:%d", port),
		"STRATA_PING_PORT_RANGE": "6",
	}
	fsys := configFS(t, "tcp.toml", fastFailureDetection...)
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i := range 3 {
		ch, col := startFromConfig(t, fsys, "tcp.toml", stacktest.Names[i], vars)
		require.NoError(t, ch.Connect(context.Background(), "kill"))
		chs, cols = append(chs, ch), append(cols, col)
	}
	stacktest.WaitForSameView(t, 2*time.Minute, chs...)

	victim := chs[2]
	victimPort := transportOf(victim).PhysicalAddress().Port()
	transportOf(victim).Stop() // every socket closes; the stack above keeps running, cut off
	stacktest.WaitFor(t, wait, func() bool {
		for _, ch := range chs[:2] {
			if v := ch.View(); v == nil || len(v.Members) != 2 {
				return false
			}
		}
		return true
	}, "the killed member is excluded")
	_ = victim.Close()

	vars2 := map[string]string{}
	for k, v := range vars {
		vars2[k] = v
	}
	vars2["STRATA_BIND_PORT"] = strconv.Itoa(int(victimPort))
	ch, col := startFromConfig(t, fsys, "tcp.toml", "C2", vars2)
	require.NoError(t, ch.Connect(context.Background(), "kill"))
	require.Equal(t, victimPort, transportOf(ch).PhysicalAddress().Port(), "restarted on the same port")
	group := []*stack.Channel{chs[0], chs[1], ch}
	stacktest.WaitForSameView(t, wait, group...)
	require.Len(t, ch.View().Members, 3)
	for i, c := range group {
		require.NoError(t, c.Send(context.Background(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 10))))
	}
	addrs := []stack.Address{group[0].Address(), group[1].Address(), group[2].Address()}
	for i, c := range []*stacktest.Collector{cols[0], cols[1], col} {
		stacktest.WaitFor(t, wait, func() bool {
			return len(c.Seqs(addrs[0])) > 0 && len(c.Seqs(addrs[1])) > 0 && len(c.Seqs(addrs[2])) > 0
		},
			"member %d hears from all three", i)
	}
}

// TestConfigErrorsNameFileLineAndKey: a bad TCP value is reported with the
// file, the line and the key.
func TestConfigErrorsNameFileLineAndKey(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`send_queue_size = 0`, `bad.toml:4: TCP: send_queue_size: must be > 0, got 0`},
		{`max_bundle_size = "32MB"`, `bad.toml:4: TCP: max_bundle_size: must be between 1KB and 16MB`},
		{`peer_addr_read_timeout = "0s"`, `bad.toml:4: TCP: peer_addr_read_timeout: must be > 0`},
		{`tls = true`, `bad.toml:1: TCP: tls_cert_file: must be set when tls = true`}, // the key is missing: the section's line
		{`conn_expiry_timeout = "-1s"`, `bad.toml:4: TCP: conn_expiry_timeout: must be >= 0`},
		{`recv_buf_size = -1`, `bad.toml:4: TCP: recv_buf_size: must be >= 0 (0: the kernel's default`},
	} {
		src := "[[protocol]]\ntype = \"TCP\"\nbind_addr = \"127.0.0.1\"\n" + c.line + "\n"
		_, err := stack.ParseConfig("bad.toml", []byte(src))
		require.Error(t, err, c.line)
		require.Contains(t, err.Error(), c.want)
	}
	src := "[[protocol]]\ntype = \"TCP\"\nbind_addr = \"127.0.0.1\"\nrecv_buf_size = 0\nsend_buf_size = 0\n"
	_, err := stack.ParseConfig("ok.toml", []byte(src))
	require.NoError(t, err, "socket buffers of 0 leave them to the kernel")
}
