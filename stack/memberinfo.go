package stack

import (
	"net/netip"

	"github.com/strata-go/strata/stack/wire"
)

// MemberInfo is what discovery learns of one member: its addresses, its
// name, and the coordinator it knows. EvFindMembers returns a list of them.
type MemberInfo struct {
	Addr     Address
	Name     string
	Physical netip.AddrPort // invalid when the transport has none (SIM)
	Coord    Address        // the coordinator of its view; zero if it has none
	IsServer bool           // it is a member of a view (not still joining)
}

// maxMemberName bounds a logical name on the wire.
const maxMemberName = 255

// MaxMemberInfoSize is the largest encoding of a MemberInfo (a name of the
// longest a receiver takes, an IPv6 address): what discovery and MERGE3
// messages need, whatever the group's size.
const MaxMemberInfoSize = AddressSize + 2 + maxMemberName + 1 + 16 + 2 + 1 + AddressSize

// AppendMemberInfo appends mi's encoding (discovery and MERGE3 send it).
func AppendMemberInfo(b []byte, mi MemberInfo) []byte {
	b = AppendAddress(b, mi.Addr)
	b = wire.AppendString(b, mi.Name)
	b = wire.AppendAddrPort(b, mi.Physical)
	b = wire.AppendBool(b, mi.IsServer)
	if mi.IsServer {
		b = AppendAddress(b, mi.Coord)
	}
	return b
}

// MemberInfoSize returns the encoded length of mi.
func MemberInfoSize(mi MemberInfo) int {
	n := AddressSize + wire.UvarintSize(uint64(len(mi.Name))) + len(mi.Name) + wire.AddrPortSize(mi.Physical) + 1
	if mi.IsServer {
		n += AddressSize
	}
	return n
}

// ReadMemberInfo reads a MemberInfo written by AppendMemberInfo.
func ReadMemberInfo(r *wire.Reader) MemberInfo {
	mi := MemberInfo{Addr: ReadAddress(r), Name: r.String(maxMemberName, "logical name"), Physical: r.AddrPort(), IsServer: r.Bool()}
	if mi.IsServer {
		mi.Coord = ReadAddress(r)
	}
	return mi
}

// IsCoord reports whether the member says it is the coordinator of its view.
func (mi MemberInfo) IsCoord() bool { return mi.IsServer && mi.Coord == mi.Addr }
