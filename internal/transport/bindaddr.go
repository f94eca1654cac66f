package transport

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// ResolveBindAddr turns bind_addr (an IPv4 address, an interface name, or
// loopback | site_local | non_loopback) into an IPv4 address of this machine and
// the interface that holds it.
func ResolveBindAddr(s string) (netip.Addr, *net.Interface, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("list interfaces: %w", err)
	}
	type cand struct {
		ip    netip.Addr
		iface *net.Interface
	}
	var all []cand
	for i := range ifaces {
		ifc := &ifaces[i]
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil || !pfx.Addr().Is4() {
				continue
			}
			all = append(all, cand{pfx.Addr(), ifc})
		}
	}
	pick := func(ok func(netip.Addr) bool, what string) (netip.Addr, *net.Interface, error) {
		for _, c := range all {
			if ok(c.ip) {
				return c.ip, c.iface, nil
			}
		}
		return netip.Addr{}, nil, fmt.Errorf("bind_addr %q: this machine has no %s IPv4 address", s, what)
	}
	switch strings.ToLower(s) {
	case "loopback":
		return pick(netip.Addr.IsLoopback, "loopback")
	case "site_local", "site-local":
		return pick(netip.Addr.IsPrivate, "site-local (10/8, 172.16/12, 192.168/16)")
	case "non_loopback", "non-loopback":
		return pick(func(a netip.Addr) bool { return !a.IsLoopback() }, "non-loopback")
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		if !ip.Is4() {
			return netip.Addr{}, nil, fmt.Errorf("bind_addr %q: only IPv4 is supported", s)
		}
		for _, c := range all {
			if c.ip == ip {
				return c.ip, c.iface, nil
			}
		}
		return netip.Addr{}, nil, fmt.Errorf("bind_addr %q: no interface of this machine has that address", s)
	}
	if ifc, err := net.InterfaceByName(s); err == nil {
		for _, c := range all {
			if c.iface.Index == ifc.Index {
				return c.ip, c.iface, nil
			}
		}
		return netip.Addr{}, nil, fmt.Errorf("bind_addr %q: interface has no IPv4 address or is down", s)
	}
	return netip.Addr{}, nil, fmt.Errorf("bind_addr %q: not an IPv4 address, an interface name, or one of loopback, site_local, non_loopback", s)
}
