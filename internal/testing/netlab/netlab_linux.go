// Package netlab makes test networks of hosts in Linux network namespaces,
// for tests of real sockets across hosts: each host has one veth link to a
// bridge in a namespace of its own, with an address from 198.18.0.0/24
// (the benchmarking range, never routed). Nothing is added to the machine's
// own namespace, and everything is removed when the test ends.
package netlab

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Lab is one test network.
type Lab struct {
	t      testing.TB
	prefix string
	bridge string
	// Hosts are the namespaces of the hosts, host i+1 at 198.18.0.(i+1).
	Hosts []string
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New makes n hosts, or skips t saying why it cannot (not root, no ip
// command, no namespaces).
func New(t testing.TB, n int) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: iproute2's ip command is not installed")
	}
	l := &Lab{t: t, prefix: fmt.Sprintf("st%04x", rand.IntN(1<<16))}
	l.bridge = l.prefix + "-br"
	if err := ip("netns", "add", l.bridge); err != nil {
		t.Skipf("skipping: cannot create a network namespace here: %v", err)
	}
	t.Cleanup(l.close)
	must := func(args ...string) {
		t.Helper()
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("-n", l.bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
	must("-n", l.bridge, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		h := fmt.Sprintf("%s-h%d", l.prefix, i)
		must("netns", "add", h)
		l.Hosts = append(l.Hosts, h)
		port := fmt.Sprintf("p%d", i)
		must("-n", h, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", l.bridge)
		must("-n", h, "addr", "add", Addr(i), "dev", "eth0")
		must("-n", h, "link", "set", "lo", "up")
		must("-n", h, "link", "set", "eth0", "up")
		must("-n", l.bridge, "link", "set", port, "master", "br0")
		must("-n", l.bridge, "link", "set", port, "up")
	}
	return l
}

// Addr returns host i's (1-based) address with its prefix length.
func Addr(i int) string { return fmt.Sprintf("198.18.0.%d/24", i) }

// IP returns host i's (1-based) address.
func IP(i int) string { return fmt.Sprintf("198.18.0.%d", i) }

// LinkDown cuts host i (1-based) off the bridge.
func (l *Lab) LinkDown(i int) { l.link(i, "down") }

// LinkUp reconnects host i (1-based).
func (l *Lab) LinkUp(i int) { l.link(i, "up") }

func (l *Lab) link(i int, state string) {
	l.t.Helper()
	if err := ip("-n", l.bridge, "link", "set", fmt.Sprintf("p%d", i), state); err != nil {
		l.t.Fatal(err)
	}
}

func (l *Lab) close() {
	for _, ns := range append(l.Hosts, l.bridge) {
		if err := ip("netns", "del", ns); err != nil {
			l.t.Logf("cleanup: %v", err)
		}
	}
}

// In runs f on an OS thread that has joined namespace ns; sockets made
// there stay in ns after the thread leaves it.
func In(ns string, f func() error) error {
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
