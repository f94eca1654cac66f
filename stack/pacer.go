package stack

import "time"

// pacerMaxWait bounds a Pacer's wait, in intervals. A longer bound leaves a
// hole open for long on a lossy link once a few requests or their answers
// were lost: at 16 intervals (8 s at 500 ms) under 20% loss, a hole once
// stayed open for over 30 s, and a GROUPFC leave behind it. JGroups'
// UNICAST3 and NAKACK2 ask again every interval.
const pacerMaxWait = 4

// Pacer spaces out retransmission requests that make no progress. A request
// whose answers are still on their way (or were lost in a full socket
// buffer) is not repeated every interval, which would feed a retransmission
// storm: while the progress mark stays put, the wait doubles, up to
// pacerMaxWait intervals. Reliable protocols keep one per peer. The zero
// value is ready.
type Pacer struct {
	at    time.Time
	mark  uint64
	wait  time.Duration
	first bool // the first request for mark is still to go
}

// Due reports whether a request may go out at now, given a progress mark
// (such as the highest delivered seqno), and records it if so. The first
// request for a new mark goes out once the mark has stayed put for first
// (at once if first is 0): a gap that a reordered message fills meanwhile
// costs no request, and a real loss is repaired after first rather than
// after a whole interval. Later ones back off from there: 2, 4, 8 times
// first and so on, up to pacerMaxWait intervals (a retransmission lost in
// the same full socket buffer is asked for again soon; a sender that is
// gone is not asked every interval). With first 0, the first request goes
// at once and the next follow interval, 2 intervals, and so on.
func (p *Pacer) Due(now time.Time, mark uint64, first, interval time.Duration) bool {
	switch {
	case mark != p.mark || p.wait == 0:
		p.mark, p.wait = mark, interval
		if first > 0 {
			p.at, p.wait, p.first = now, first, true
			return false
		}
	case now.Sub(p.at) < p.wait:
		return false
	case p.first:
		p.first, p.wait = false, min(2*p.wait, pacerMaxWait*interval)
	default:
		p.wait = min(2*p.wait, pacerMaxWait*interval)
	}
	p.at = now
	return true
}
