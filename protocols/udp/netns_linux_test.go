package udp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// netLab is a test network of hosts in network namespaces: each host has
// one veth link to a bridge in a namespace of its own. Nothing is added to
// the machine's own namespace; Close removes everything.
type netLab struct {
	t      *testing.T
	prefix string
	bridge string
	hosts  []string
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetLab makes n hosts with addresses 198.18.0.1..n/24, or skips t
// saying why it cannot.
func newNetLab(t *testing.T, n int) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: iproute2's ip command is not installed")
	}
	lab := &netLab{t: t, prefix: fmt.Sprintf("st%04x", rand.IntN(1<<16))}
	lab.bridge = lab.prefix + "-br"
	if err := ipCmd("netns", "add", lab.bridge); err != nil {
		t.Skipf("skipping: cannot create a network namespace here: %v", err)
	}
	t.Cleanup(lab.close)
	must := func(args ...string) {
		t.Helper()
		require.NoError(t, ipCmd(args...))
	}
	must("-n", lab.bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
	must("-n", lab.bridge, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		h := fmt.Sprintf("%s-h%d", lab.prefix, i)
		must("netns", "add", h)
		lab.hosts = append(lab.hosts, h)
		port := fmt.Sprintf("p%d", i)
		must("-n", h, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", lab.bridge)
		must("-n", h, "addr", "add", fmt.Sprintf("198.18.0.%d/24", i), "dev", "eth0")
		must("-n", h, "link", "set", "lo", "up")
		must("-n", h, "link", "set", "eth0", "up")
		must("-n", lab.bridge, "link", "set", port, "master", "br0")
		must("-n", lab.bridge, "link", "set", port, "up")
	}
	return lab
}

// linkDown cuts host i (1-based) off the bridge.
func (l *netLab) linkDown(i int) {
	require.NoError(l.t, ipCmd("-n", l.bridge, "link", "set", fmt.Sprintf("p%d", i), "down"))
}

func (l *netLab) close() {
	for _, ns := range append(l.hosts, l.bridge) {
		if err := ipCmd("netns", "del", ns); err != nil {
			l.t.Logf("cleanup: %v", err)
		}
	}
}

// inNetns runs f on an OS thread that has joined namespace ns; sockets made
// there stay in ns after the thread leaves it.
func inNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := setns(target.Fd()); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			runtime.UnlockOSThread()
			return
		}
		ferr := f()
		if err := setns(self.Fd()); err != nil {
			// The thread stays in ns: keep it locked so it dies with us.
			errc <- fmt.Errorf("setns back: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func setns(fd uintptr) error { return unix.Setns(int(fd), unix.CLONE_NEWNET) }

func TestMembersInThreeNetworkNamespaces(t *testing.T) {
	lab := newNetLab(t, 3)
	cfg := testConfig(t)
	cfg.IPTTL = 1
	var ms []*member
	for i, h := range lab.hosts {
		c := cfg
		c.BindAddr = fmt.Sprintf("198.18.0.%d", i+1)
		m := &member{udp: udp.New(c), col: stacktest.NewCollector()}
		require.NoError(t, inNetns(h, func() error {
			ch, err := stack.NewChannel([]stack.Protocol{m.udp}, stack.WithName(fmt.Sprintf("ns%d", i+1)), stack.WithReceiver(m.col))
			if err != nil {
				return err
			}
			m.ch = ch
			return ch.Connect(context.Background(), "netns")
		}))
		t.Cleanup(func() { _ = m.ch.Close() })
		ms = append(ms, m)
	}
	introduce(t, ms)
	ctx := context.Background()
	round := func(senders []*member, tag string) {
		t.Helper()
		for _, m := range senders {
			require.NoError(t, m.ch.SendTo(ctx, stack.Address{}, []byte(tag+" mcast from "+m.ch.Name())))
			for _, o := range senders {
				if o != m {
					require.NoError(t, m.ch.SendTo(ctx, o.ch.Address(), []byte(tag+" ucast from "+m.ch.Name())))
				}
			}
		}
		for _, o := range senders {
			want := 2*len(senders) - 1 // every multicast (own included) + a unicast from each other sender
			stacktest.WaitFor(t, 10*time.Second, func() bool { return count(o.col, tag) == want },
				"%s receives %d %q messages", o.ch.Name(), want, tag)
		}
	}
	round(ms, "all")
	lab.linkDown(3)
	round(ms[:2], "two")
	require.Zero(t, count(ms[2].col, "two"), "the cut-off host hears nothing")
}

func count(c *stacktest.Collector, tag string) int {
	n := 0
	for _, m := range c.Messages() {
		if strings.HasPrefix(string(m.Payload), tag+" ") {
			n++
		}
	}
	return n
}
