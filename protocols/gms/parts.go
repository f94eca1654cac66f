package gms

import (
	"time"

	"github.com/strata-go/strata/internal/parts"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// ---- messages in parts
//
// GMS sits below FRAG, and its views and digests grow with the group
// (about 35 bytes per member in a join answer): a JOIN_RSP, a full VIEW,
// an INSTALL_VIEW, a MERGE_REQ or MERGE_RSP, the answer to a GET_VIEW
// would outgrow one datagram near 1,850 members with 64 KB datagrams, and
// at the 57th with 2 KB ones. So GMS sends any message larger than the
// stack's ControlLimit (the transport's largest datagram less headroom)
// in PART messages: the message's encoding cut into pieces, each carried
// in the payload of a PART with the same flags (a view's parts in order
// after the coordinator's earlier multicasts, the others OOB), through
// NAKACK and UNICAST2 below. The receiver puts the pieces back together
// (parts.Reassembler, bounded per sender and in all) and handles the
// message as if it had come whole.
//
// Why here, and not FRAG below GMS or a fragmenter in the transport: the
// parts go through the reliable layers, so each lost part is
// retransmitted on its own, and a message of 30 parts arrives under 20%
// loss; 30 unreliable fragments of one datagram each would all arrive
// together with probability 0.8^30, about 1 in 800, and every resend of
// the view would start from nothing. FRAG below GMS would also take the
// application's messages below flow control. JGroups keeps its views and
// digests in one message (GMS below FRAG2, delta views, compact
// encodings), and lives with the datagram's limit; strata does not.
//
// A message's id is a hash of its bytes, so the same view sent again (to
// a member that did not acknowledge it, or a joiner's answer resent) has
// the same id and the parts of both sendings complete one message. The
// last part of a unicast lost is repaired by the next message on that
// connection, or by the whole message sent again (view_ack_timeout, the
// merge's asks): nothing waits for ever.

// minControlLimit is the smallest ControlLimit GMS works with: a PART's
// header and a piece of a useful size (any larger message goes in parts).
const minControlLimit = 512

// partLimits bound what a member keeps of messages in parts: a merge view
// of 65,536 members with its digest is under 8 MB.
var partLimits = parts.Limits{MaxWhole: 8 << 20, MaxPerSender: 8, MaxBytes: 64 << 20, TTL: 2 * time.Minute}

// MinControlLimit is the smallest stack.ControlLimit GMS works with, for
// the loader's check of the transport's largest datagram.
func (c *Config) MinControlLimit() stack.Size { return minControlLimit }

var _ stack.ControlSizer = (*Config)(nil)

// part takes one part of a larger message from src and, once the message
// is whole, handles it.
func (g *GMS) part(src stack.Address, p Part, payload []byte) {
	if src == g.LocalAddress() && p.Of != typeView {
		return // as handle does with the whole message
	}
	b := g.parts.Add(src, p.ID, int(p.Index), int(p.Count), payload, time.Now())
	if b == nil {
		return
	}
	r := wire.NewReader(b)
	dh, err := decodeHeader(r)
	h, ok := dh.(*Header)
	if err != nil || !ok || h.Type != p.Of || r.Len() != 0 {
		g.count.msgsIgnored.Add(1)
		g.Log().Debug("gms: a message in parts does not decode", "from", src, "type", p.Of, "error", err)
		return
	}
	g.handle(src, h)
}
