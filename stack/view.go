package stack

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-go/strata/stack/wire"
)

// ViewID names one view: the member that created it and a sequence number
// that grows with every view change. Two views are the same view exactly when
// their ids are equal.
type ViewID struct {
	Creator Address
	Seq     uint64
}

// Compare orders view ids by sequence number, then by creator.
func (id ViewID) Compare(o ViewID) int {
	switch {
	case id.Seq < o.Seq:
		return -1
	case id.Seq > o.Seq:
		return 1
	}
	return id.Creator.Compare(o.Creator)
}

// String formats the id as "[creator|seq]", as JGroups prints views.
func (id ViewID) String() string { return fmt.Sprintf("[%s|%d]", id.Creator, id.Seq) }

// View is the ordered membership of a group at one time. The first member is
// the coordinator. A view is immutable once installed; share it freely.
// A merge view (after a partition heals) also lists the subgroups it merged.
type View struct {
	ID        ViewID
	Members   []Address
	Subgroups []*View // non-nil only for merge views
}

// NewView builds a view with the given creator, sequence number and members.
func NewView(creator Address, seq uint64, members ...Address) *View {
	return &View{ID: ViewID{Creator: creator, Seq: seq}, Members: slices.Clone(members)}
}

// NewMergeView builds a merge view of the members, recording the subgroups it
// merged.
func NewMergeView(creator Address, seq uint64, members []Address, subgroups []*View) *View {
	v := NewView(creator, seq, members...)
	v.Subgroups = slices.Clone(subgroups)
	if v.Subgroups == nil {
		v.Subgroups = []*View{}
	}
	return v
}

// IsMerge reports whether v is a merge view.
func (v *View) IsMerge() bool { return v != nil && v.Subgroups != nil }

// Coordinator returns the first member, or the zero address for an empty view.
func (v *View) Coordinator() Address {
	if v == nil || len(v.Members) == 0 {
		return Address{}
	}
	return v.Members[0]
}

// Size returns the number of members.
func (v *View) Size() int {
	if v == nil {
		return 0
	}
	return len(v.Members)
}

// Contains reports whether a is a member.
func (v *View) Contains(a Address) bool { return v.Index(a) >= 0 }

// Index returns the position of a in the member list, or -1.
func (v *View) Index(a Address) int {
	if v == nil {
		return -1
	}
	return slices.Index(v.Members, a)
}

// Diff returns the members of v that are not in old (joined) and the members
// of old that are not in v (left). A nil old counts as empty.
func (v *View) Diff(old *View) (joined, left []Address) {
	if old.Size() > smallView || v.Size() > smallView {
		in, was := v.MemberSet(), old.MemberSet()
		for _, m := range v.Members {
			if _, ok := was[m]; !ok {
				joined = append(joined, m)
			}
		}
		if old != nil {
			for _, m := range old.Members {
				if _, ok := in[m]; !ok {
					left = append(left, m)
				}
			}
		}
		return joined, left
	}
	for _, m := range v.Members {
		if !old.Contains(m) {
			joined = append(joined, m)
		}
	}
	if old != nil {
		for _, m := range old.Members {
			if !v.Contains(m) {
				left = append(left, m)
			}
		}
	}
	return joined, left
}

// smallView is the size up to which testing every member of one view
// against another with Contains (linear) costs less than a set.
const smallView = 32

// Lookup returns a membership test of v for a caller about to test about n
// addresses: Contains for a few or a small view, a set (MemberSet) for
// many against a large one, so the caller's loop stays O(n + N).
func (v *View) Lookup(n int) func(Address) bool {
	if n <= 4 || v.Size() <= smallView {
		return v.Contains
	}
	in := v.MemberSet()
	return func(a Address) bool {
		_, ok := in[a]
		return ok
	}
}

// MemberSet returns the members as a set, for a caller that tests many
// addresses against one view: Contains is linear in the view's size.
func (v *View) MemberSet() map[Address]struct{} {
	set := make(map[Address]struct{}, v.Size())
	if v != nil {
		for _, m := range v.Members {
			set[m] = struct{}{}
		}
	}
	return set
}

// String formats the view as "[A|3] (2) [A, B]".
func (v *View) String() string {
	if v == nil {
		return "<no view>"
	}
	var b strings.Builder
	if v.IsMerge() {
		b.WriteString("MergeView::")
	}
	fmt.Fprintf(&b, "%s (%d) [", v.ID, len(v.Members))
	for i, m := range v.Members {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.String())
	}
	b.WriteString("]")
	if v.IsMerge() {
		b.WriteString(" subgroups=")
		for i, s := range v.Subgroups {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s", s.ID)
		}
	}
	return b.String()
}

// Limits that decoders enforce on views from the wire.
const (
	maxViewMembers   = 1 << 16
	maxViewSubgroups = 1 << 10
)

// AppendView appends the wire encoding of v (a merge view's subgroups one
// level deep).
func AppendView(b []byte, v *View) []byte {
	b = AppendAddress(b, v.ID.Creator)
	b = wire.AppendUvarint(b, v.ID.Seq)
	b = wire.AppendUvarint(b, uint64(len(v.Members)))
	for _, m := range v.Members {
		b = AppendAddress(b, m)
	}
	if !v.IsMerge() {
		return append(b, 0)
	}
	b = append(b, 1)
	b = wire.AppendUvarint(b, uint64(len(v.Subgroups)))
	for _, s := range v.Subgroups {
		sub := *s
		sub.Subgroups = nil
		b = AppendView(b, &sub)
	}
	return b
}

// ReadView decodes a view written by AppendView.
func ReadView(r *wire.Reader) *View { return readView(r, true) }

func readView(r *wire.Reader, allowMerge bool) *View {
	v := &View{}
	v.ID.Creator = ReadAddress(r)
	v.ID.Seq = r.Uvarint()
	n := r.Uvarint()
	if n > maxViewMembers || n*AddressSize > uint64(r.Len()) {
		r.Fail("view member count %d too large", n)
		return nil
	}
	v.Members = make([]Address, n)
	for i := range v.Members {
		v.Members[i] = ReadAddress(r)
	}
	if r.Bool() {
		if !allowMerge {
			r.Fail("nested merge view")
			return nil
		}
		ns := r.Uvarint()
		if ns > maxViewSubgroups || ns > uint64(r.Len()) {
			r.Fail("subgroup count %d too large", ns)
			return nil
		}
		v.Subgroups = make([]*View, 0, ns)
		for range ns {
			s := readView(r, false)
			if r.Err() != nil {
				return nil
			}
			v.Subgroups = append(v.Subgroups, s)
		}
	}
	if r.Err() != nil {
		return nil
	}
	return v
}

// ViewSize returns the length of AppendView's encoding of v.
func ViewSize(v *View) int {
	n := AddressSize + wire.UvarintSize(v.ID.Seq) + wire.UvarintSize(uint64(len(v.Members))) + len(v.Members)*AddressSize + 1
	if v.IsMerge() {
		n += wire.UvarintSize(uint64(len(v.Subgroups)))
		for _, s := range v.Subgroups {
			sub := *s
			sub.Subgroups = nil
			n += ViewSize(&sub)
		}
	}
	return n
}
