package stack

// MembershipKind classifies the membership layer's messages for a layer
// that guards membership (AUTH), whatever protocol implements it.
type MembershipKind uint8

// Membership message kinds.
const (
	// MembershipOther: not guarded (views to members, leaves, acks).
	MembershipOther MembershipKind = iota
	// MembershipJoinRequest: a member asks to join.
	MembershipJoinRequest
	// MembershipMerge: merge requests and answers between coordinators.
	MembershipMerge
	// MembershipInstall: a view (with its digest) to install.
	MembershipInstall
)

// MembershipHeader is implemented by the header the membership layer puts
// at IDGMS, so a guard below it can tell what a message asks for without
// importing the membership protocol.
type MembershipHeader interface {
	Header
	Membership() MembershipKind
}
