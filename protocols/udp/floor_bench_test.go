package udp_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/internal/cpustat"
	"github.com/strata-go/strata/stack/stacktest"
)

// BenchmarkKernelFloorMulticast is what the kernel alone costs for the
// multicast shapes' traffic: datagrams of 64, 40 or 16 1 KB messages
// (udp.toml's full bundles are 64,000 bytes; perf runs send 25-40 a bundle
// on average) sent with sendmmsg to a multicast group on 127.0.0.1 and
// read with recvmmsg by one member's socket, with nothing of the stack
// around them. It reports the 1 KB messages a second this carries and the
// process's CPU time (user and system, from getrusage, so that time the
// host takes away from the machine is not counted) per 1 KB message: the
// floor under any stack's CPU per message on this machine, and what
// bundles that are not full add to it.
func BenchmarkKernelFloorMulticast(b *testing.B) {
	for _, per := range []int64{64, 40, 16} {
		b.Run(fmt.Sprintf("msgs=%d", per), func(b *testing.B) { kernelFloor(b, per) })
	}
}

func kernelFloor(b *testing.B, perDgram int64) {
	const (
		batch    = 16
		inFlight = 2 << 20 // bytes: within the 4 MB receive buffer asked for (the kernel caps it at rmem_max)
	)
	dgram := int(perDgram) * 1000
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

	w := stacktest.NewWindow(inFlight / 1000) // counted in 1 KB messages
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
			for range int64(n) * perDgram {
				w.Got()
			}
		}
	}()

	out := make([]ipv4.Message, batch)
	for i := range out {
		out[i].Buffers = [][]byte{make([]byte, dgram)}
		out[i].Addr = group
	}
	b.SetBytes(int64(dgram))
	b.ReportAllocs()
	cpu0 := cpustat.Process()
	start := time.Now()
	sent := int64(0)
	for sent < int64(b.N) {
		n := min(batch, int64(b.N)-sent)
		if !w.AwaitFor((sent+n)*perDgram, time.Second) {
			break // lost beyond the window (a receive buffer under 2 MB): reported below
		}
		k, err := sp.WriteBatch(out[:n], 0)
		if err != nil {
			b.Fatal(err)
		}
		sent += int64(k)
	}
	got := w.Settle(int64(b.N)*perDgram, 500*time.Millisecond) / perDgram
	el, cpu := time.Since(start), cpustat.Process()-cpu0
	if got == 0 {
		b.Fatal("no datagram arrived")
	}
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
