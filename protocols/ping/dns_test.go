package ping_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/protocols/ping"
	"github.com/strata-go/strata/protocols/tcp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

const wait = 30 * time.Second

// dnsServer is a DNS server on 127.0.0.1 that answers A, AAAA and SRV
// questions from records the test sets, and NXDOMAIN for other names.
type dnsServer struct {
	addr    string
	s       *dns.Server
	queries atomic.Int64

	mu  sync.Mutex
	a   map[string][]netip.Addr
	srv map[string][]*dns.SRV
}

func startDNS(t testing.TB) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	d := &dnsServer{addr: pc.LocalAddr().String(), a: map[string][]netip.Addr{}, srv: map[string][]*dns.SRV{}}
	started := make(chan struct{})
	d.s = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(d.serve), NotifyStartedFunc: func() { close(started) }}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = d.s.ActivateAndServe()
	}()
	<-started
	t.Cleanup(func() {
		_ = d.s.Shutdown()
		<-served
	})
	return d
}

func (d *dnsServer) setA(name string, addrs ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name] = addrs
}

func (d *dnsServer) setSRV(name string, targets map[string]uint16) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var rrs []*dns.SRV
	for target, port := range targets {
		rrs = append(rrs, &dns.SRV{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeSRV, Class: dns.ClassINET}, Priority: 0, Weight: 10, Port: port, Target: target})
	}
	d.srv[name] = rrs
}

func (d *dnsServer) serve(w dns.ResponseWriter, req *dns.Msg) {
	d.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	d.mu.Lock()
	for _, q := range req.Question {
		addrs, aok := d.a[q.Name]
		srvs, sok := d.srv[q.Name]
		if !aok && !sok {
			m.Rcode = dns.RcodeNameError
			continue
		}
		hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET}
		switch q.Qtype {
		case dns.TypeA:
			for _, a := range addrs {
				if a.Is4() {
					m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
				}
			}
		case dns.TypeAAAA:
			for _, a := range addrs {
				if a.Is6() {
					m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
				}
			}
		case dns.TypeSRV:
			for _, s := range srvs {
				m.Answer = append(m.Answer, s)
			}
		}
	}
	d.mu.Unlock()
	_ = w.WriteMsg(m)
}

var localhost = netip.MustParseAddr("127.0.0.1")

func freeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startKubernetes(t *testing.T, name string, vars map[string]string) (*stack.Channel, *stacktest.Collector) {
	t.Helper()
	col := stacktest.NewCollector()
	ch, err := stack.New(stack.Shipped("kubernetes.toml"), stack.WithVars(vars), stack.WithName(name), stack.WithReceiver(col))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Connect(context.Background(), "k8s"))
	return ch, col
}

func checkGroup(t *testing.T, chs []*stack.Channel, cols []*stacktest.Collector) {
	t.Helper()
	stacktest.WaitForSameView(t, wait, chs...)
	var addrs []stack.Address
	for i, ch := range chs {
		addrs = append(addrs, ch.Address())
		require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 8))))
	}
	for i, col := range cols {
		stacktest.WaitFor(t, wait, func() bool { return col.Len() >= len(chs) }, "member %d gets every multicast", i)
		require.Empty(t, col.CheckExactlyOnce(addrs, 1, true))
	}
}

// TestMembersFoundThroughARecords: three members on kubernetes.toml find
// each other through the A record of one name (one address, ports
// port..port+port_range, as several pods on one node would be).
func TestMembersFoundThroughARecords(t *testing.T) {
	stacktest.CheckLeaks(t)
	d := startDNS(t)
	d.setA("group.strata.test.", localhost)
	port := freeTCPPort(t)
	vars := map[string]string{
		"STRATA_BIND_PORT":       strconv.Itoa(port),
		"STRATA_PING_PORT_RANGE": "5",
		"STRATA_DNS_QUERY":       "group.strata.test.",
		"STRATA_DNS_ADDRESS":     d.addr,
	}
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i := range 3 {
		ch, col := startKubernetes(t, stacktest.Names[i], vars)
		chs, cols = append(chs, ch), append(cols, col)
	}
	checkGroup(t, chs, cols)
	require.Positive(t, d.queries.Load())
}

// TestMembersFoundThroughSRVRecords: three members on kubernetes.toml with
// SRV records find each other at the records' ports.
func TestMembersFoundThroughSRVRecords(t *testing.T) {
	stacktest.CheckLeaks(t)
	d := startDNS(t)
	ports := map[string]uint16{}
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i := range 3 {
		port := freeTCPPort(t)
		target := fmt.Sprintf("m%d.strata.test.", i)
		d.setA(target, localhost)
		ports[target] = uint16(port)
		d.setSRV("_strata._tcp.group.strata.test.", ports)
		vars := map[string]string{
			"STRATA_BIND_PORT":       strconv.Itoa(port),
			"STRATA_DNS_RECORD_TYPE": "SRV",
			"STRATA_DNS_QUERY":       "_strata._tcp.group.strata.test.",
			"STRATA_DNS_ADDRESS":     d.addr,
		}
		ch, col := startKubernetes(t, stacktest.Names[i], vars)
		require.Equal(t, uint16(port), transportOf(ch).PhysicalAddress().Port())
		chs, cols = append(chs, ch), append(cols, col)
	}
	checkGroup(t, chs, cols)
}

func transportOf(ch *stack.Channel) *tcp.TCP { return stack.Of(ch).Protocols()[0].(*tcp.TCP) }

// spy is a TCP listener that counts the frames sent to it (discovery
// requests), as a host named in DNS but running no member would see them.
type spy struct {
	l      net.Listener
	frames atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func startSpy(t testing.TB) *spy {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	s := &spy{l: l}
	s.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Go(func() { s.read(c) })
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *spy) read(c net.Conn) {
	hello := make([]byte, 12)
	if _, err := io.ReadFull(c, hello); err != nil {
		return
	}
	var h [4]byte
	for {
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(h[:]))); err != nil {
			return
		}
		s.frames.Add(1)
	}
}

func (s *spy) port() uint16 { return uint16(s.l.Addr().(*net.TCPAddr).Port) }

// TestRemovedRecordIsNoLongerProbed: each discovery round resolves the
// name again; a host whose record was removed gets no more requests, and
// one whose record was added gets them.
func TestRemovedRecordIsNoLongerProbed(t *testing.T) {
	stacktest.CheckLeaks(t)
	d := startDNS(t)
	x, y := startSpy(t), startSpy(t)
	d.setA("x.strata.test.", localhost)
	d.setA("y.strata.test.", localhost)
	const name = "_strata._tcp.probe.strata.test."
	d.setSRV(name, map[string]uint16{"x.strata.test.": x.port()})

	tc := tcp.DefaultConfig()
	tc.BindPort = 0
	dc := ping.DefaultDNSConfig()
	dc.Query, dc.RecordType, dc.Address = name, "SRV", d.addr
	dc.Timeout = 100 * time.Millisecond
	dp := ping.NewDNS(dc)
	ch, err := stack.New(stack.FromProtocols(tcp.New(tc), dp))
	require.NoError(t, err)
	defer ch.Close()
	stack.Of(ch).SetCluster("probe")
	require.NoError(t, ch.Connect(context.Background(), "probe"))
	round := func() {
		_, err := stack.Ask(context.Background(), stack.Of(ch), stack.EvFindMembers{Timeout: dc.Timeout})
		require.NoError(t, err)
	}
	sent := func() int64 { return stacktest.Stat(t, dp, "requests_sent") }

	round()
	stacktest.WaitFor(t, wait, func() bool { return x.frames.Load() == sent() }, "x gets every request while its record exists")
	require.Positive(t, x.frames.Load())
	require.Equal(t, []netip.AddrPort{netip.AddrPortFrom(localhost, x.port())}, dp.Hosts())

	d.setSRV(name, map[string]uint16{"y.strata.test.": y.port()})
	before, xs := sent(), x.frames.Load()
	for range 3 {
		round()
	}
	stacktest.WaitFor(t, wait, func() bool { return y.frames.Load()+x.frames.Load()-xs == sent()-before }, "every later request arrives")
	require.Equal(t, xs, x.frames.Load(), "x, removed, gets no more")
	require.Equal(t, sent()-before, y.frames.Load(), "y, added, gets every later request")
	require.Equal(t, []netip.AddrPort{netip.AddrPortFrom(localhost, y.port())}, dp.Hosts())
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	for _, c := range []struct {
		set func(*ping.DNSConfig)
		key string
	}{
		{func(c *ping.DNSConfig) { c.Query = "" }, "dns_query"},
		{func(c *ping.DNSConfig) { c.RecordType = "MX" }, "dns_record_type"},
		{func(c *ping.DNSConfig) { c.Address = "resolver" }, "dns_address"},
		{func(c *ping.DNSConfig) { c.Port = 0 }, "port"},
		{func(c *ping.DNSConfig) { c.DNSTimeout = 0 }, "dns_timeout"},
	} {
		cfg := ping.DefaultDNSConfig()
		cfg.Query = "x.test."
		c.set(&cfg)
		err := cfg.Validate()
		var ke *stack.KeyError
		require.ErrorAs(t, err, &ke)
		require.Equal(t, c.key, ke.Key)
	}
}
