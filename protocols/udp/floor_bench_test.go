package udp_test

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/internal/cpustat"
	"github.com/strata-go/strata/stack/stacktest"
)

// BenchmarkKernelFloorMulticast64KB is what the kernel alone costs for the
// multicast shapes' traffic: 64,000-byte datagrams (udp.toml's bundles of
// 64 1 KB messages) sent with sendmmsg to a multicast group on 127.0.0.1
// and read with recvmmsg by one member's socket, with nothing of the stack
// around them. It reports the 1 KB messages a second this carries and the
// process's CPU time (user and system, from getrusage, so that time the
// host takes away from the machine is not counted) per 1 KB message: the
// floor under any stack's CPU per message on this machine.
func BenchmarkKernelFloorMulticast64KB(b *testing.B) {
	const (
		dgram    = 64000
		perDgram = 64 // 1 KB messages a datagram carries
		batch    = 16
		inFlight = 32 // datagrams: 2 MB, within the 4 MB receive buffer
	)
	cfg := testConfig(b)
	group := &net.UDPAddr{IP: net.ParseIP(cfg.McastAddr).To4(), Port: cfg.McastPort}
	lo := loopbackInterface(b)

	rc, err := net.ListenUDP("udp4", group) // the group address, as UDP binds its multicast socket
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	_ = rc.SetReadBuffer(4 << 20)
	rp := ipv4.NewPacketConn(rc)
	if err := rp.JoinGroup(lo, group); err != nil {
		b.Fatal(err)
	}
	sc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	_ = sc.SetWriteBuffer(4 << 20)
	sp := ipv4.NewPacketConn(sc)
	for _, err := range []error{sp.SetMulticastInterface(lo), sp.SetMulticastTTL(0), sp.SetMulticastLoopback(true)} {
		if err != nil {
			b.Fatal(err)
		}
	}

	w := stacktest.NewWindow(inFlight * perDgram) // counted in 1 KB messages
	done := make(chan struct{})
	go func() {
		defer close(done)
		ms := make([]ipv4.Message, batch)
		for i := range ms {
			ms[i].Buffers = [][]byte{make([]byte, 65536)}
		}
		for {
			n, err := rp.ReadBatch(ms, 0)
			if err != nil {
				return
			}
			for range n * perDgram {
				w.Got()
			}
		}
	}()

	out := make([]ipv4.Message, batch)
	for i := range out {
		out[i].Buffers = [][]byte{make([]byte, dgram)}
		out[i].Addr = group
	}
	b.SetBytes(dgram)
	b.ReportAllocs()
	cpu0 := cpustat.Process()
	start := time.Now()
	sent := int64(0)
	for sent < int64(b.N) {
		n := min(batch, int64(b.N)-sent)
		w.Await((sent + n - batch) * perDgram)
		k, err := sp.WriteBatch(out[:n], 0)
		if err != nil {
			b.Fatal(err)
		}
		sent += int64(k)
	}
	got := w.Settle(int64(b.N)*perDgram, 500*time.Millisecond) / perDgram
	el, cpu := time.Since(start), cpustat.Process()-cpu0
	b.ReportMetric(float64(got*perDgram)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(got*perDgram), "cpu-ns/msg")
	b.ReportMetric(100*float64(int64(b.N)-got)/float64(b.N), "%lost")
	rc.Close()
	<-done
}

// loopbackInterface is the interface holding 127.0.0.1, on which the
// benchmark's multicast stays.
func loopbackInterface(b *testing.B) *net.Interface {
	ifs, err := net.Interfaces()
	if err != nil {
		b.Fatal(err)
	}
	for i := range ifs {
		addrs, _ := ifs[i].Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(net.IPv4(127, 0, 0, 1)) {
				return &ifs[i]
			}
		}
	}
	b.Skip("no interface holds 127.0.0.1")
	return nil
}
