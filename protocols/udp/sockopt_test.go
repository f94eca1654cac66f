package udp_test

import (
	"net"

	"golang.org/x/net/ipv4"
)

// setMulticastLoopback pins a test socket's multicast sends to loopback.
func setMulticastLoopback(c *net.UDPConn) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	p := ipv4.NewPacketConn(c)
	if err := p.SetMulticastInterface(lo); err != nil {
		return err
	}
	if err := p.SetMulticastTTL(0); err != nil {
		return err
	}
	return p.SetMulticastLoopback(true)
}
