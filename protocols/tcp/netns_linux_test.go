package tcp_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/netlab"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// netnsEdits make a shipped TCP config detect a cut host and merge a
// healed one within seconds (the shipped intervals are JGroups', tens of
// seconds).
var netnsEdits = append([]string{
	"min_interval = \"10s\"\nmax_interval = \"30s\"", "min_interval = \"300ms\"\nmax_interval = \"1s\"\ncheck_interval = \"2s\"",
}, fastFailureDetection...)

// splitAndMerge starts one member per host of lab on file (from fsys,
// with vars(i) for host i), waits for one view of 3, cuts host 3 off and
// waits for views of 2 and 1, heals it and waits for one merge view.
func splitAndMerge(t *testing.T, lab *netlab.Lab, fsys fstest.MapFS, file string, vars func(i int) map[string]string) {
	var chs []*stack.Channel
	for i := range lab.Hosts {
		ns := lab.Hosts[i]
		var ch *stack.Channel
		// Init checks the address and Connect listens in the host's
		// namespace; connections to peers are dialled there too.
		require.NoError(t, netlab.In(ns, func() (err error) {
			ch, err = stack.New(stack.FromFS(fsys, file), stack.WithVars(vars(i)), stack.WithName(fmt.Sprintf("host%d", i+1)))
			return err
		}))
		t.Cleanup(func() { _ = ch.Close() })
		transportOf(ch).SetDial(func(ctx context.Context, d *net.Dialer, addr string) (c net.Conn, err error) {
			err = netlab.In(ns, func() (err error) { c, err = d.DialContext(ctx, "tcp4", addr); return err })
			return c, err
		})
		chs = append(chs, ch)
	}
	errs := make(chan error, len(chs))
	for i, ch := range chs {
		go func() {
			errs <- netlab.In(lab.Hosts[i], func() error { return ch.Connect(context.Background(), "netns-tcp") })
		}()
	}
	for range chs {
		require.NoError(t, <-errs)
	}
	stacktest.WaitForSameView(t, 90*time.Second, chs...)

	start := time.Now()
	lab.LinkDown(3)
	stacktest.WaitForSameView(t, 30*time.Second, chs[0], chs[1])
	stacktest.WaitForSameView(t, 30*time.Second, chs[2])
	t.Logf("%s: link down to a view of the other two: %s", file, time.Since(start))

	start = time.Now()
	lab.LinkUp(3)
	stacktest.WaitForSameView(t, 90*time.Second, chs...)
	t.Logf("%s: link up to the merge view: %s", file, time.Since(start))
	v := chs[0].View()
	require.True(t, v.IsMerge(), "a merge view: %s", v)
	require.Len(t, v.Subgroups, 2)
}

// TestThreeHostsOnTCPConfigSplitAndMergeInNetworkNamespaces: tcp.toml on
// three hosts (namespaces on a bridge, 198.18.0.1-3) forms one view of 3;
// host 3's link goes down and the others install a view without it; the
// link comes back and one merge view of all 3 is installed everywhere.
func TestThreeHostsOnTCPConfigSplitAndMergeInNetworkNamespaces(t *testing.T) {
	stacktest.CheckLeaks(t)
	lab := netlab.New(t, 3)
	hosts := []string{netlab.IP(1) + ":7800", netlab.IP(2) + ":7800", netlab.IP(3) + ":7800"}
	splitAndMerge(t, lab, configFS(t, "tcp.toml", netnsEdits...), "tcp.toml", func(i int) map[string]string {
		return map[string]string{
			"STRATA_BIND_ADDR":     netlab.IP(i + 1),
			"STRATA_BIND_PORT":     "7800",
			"STRATA_INITIAL_HOSTS": strings.Join(hosts, ","),
		}
	})
}

// TestThreeHostsOnKubernetesConfigSplitAndMergeInNetworkNamespaces: the
// same on kubernetes.toml, with the test's DNS server (on 127.0.0.1 of the
// test's own namespace) naming the three hosts in one A record set.
func TestThreeHostsOnKubernetesConfigSplitAndMergeInNetworkNamespaces(t *testing.T) {
	stacktest.CheckLeaks(t)
	lab := netlab.New(t, 3)
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	const name = "group.strata.test."
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		for _, q := range req.Question {
			switch {
			case q.Name != name:
				m.Rcode = dns.RcodeNameError
			case q.Qtype == dns.TypeA:
				for i := 1; i <= 3; i++ {
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.ParseIP(netlab.IP(i))})
				}
			}
		}
		_ = w.WriteMsg(m)
	})}
	started, served := make(chan struct{}), make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { defer close(served); _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown(); <-served })
	splitAndMerge(t, lab, configFS(t, "kubernetes.toml", netnsEdits...), "kubernetes.toml", func(i int) map[string]string {
		return map[string]string{
			"STRATA_BIND_ADDR":   netlab.IP(i + 1),
			"STRATA_BIND_PORT":   "7800",
			"STRATA_DNS_QUERY":   name,
			"STRATA_DNS_ADDRESS": pc.LocalAddr().String(),
		}
	})
}
