package udp

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/net/bpf"
)

// skfNetOff is the kernel's SKF_NET_OFF: socket-filter loads at offsets
// from it address the packet's IP header, wherever the filter's own
// offset 0 is.
const skfNetOff = -0x100000

// ownMulticastFilter returns a socket filter for the multicast socket that
// drops the member's own multicasts (IPv4 source self, UDP source port its
// unicast port) before the kernel queues them: with multicast loopback
// they come back to every member on the host, this one included, and were
// read only to be dropped. Everything else (packets with IP options too)
// passes.
func ownMulticastFilter(self netip.AddrPort) ([]bpf.RawInstruction, error) {
	ip := self.Addr().As4()
	return bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: netOff(0), Size: 1},                  // version and header length
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x45, SkipTrue: 4}, // options: pass
		bpf.LoadAbsolute{Off: netOff(12), Size: 4},                 // source address
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: binary.BigEndian.Uint32(ip[:]), SkipTrue: 2},
		bpf.LoadAbsolute{Off: netOff(20), Size: 2}, // UDP source port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(self.Port()), SkipTrue: 1},
		bpf.RetConstant{Val: 0xffffffff}, // pass
		bpf.RetConstant{Val: 0},          // drop
	})
}

// netOff is the filter offset of byte k of the IP header.
func netOff(k int32) uint32 { return uint32(skfNetOff + k) }
