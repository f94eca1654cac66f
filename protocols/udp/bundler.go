package udp

import (
	"errors"
	"net"

	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/internal/transport"
	"github.com/strata-go/strata/stack"
)

// sender collects datagrams with their destinations and writes them with
// as few sendmmsg calls as possible.
type sender struct {
	u       *UDP
	paced   bool // the bundler's: group datagrams wait for the member's own to be read back (echoPacer)
	msgs    []ipv4.Message
	bufs    []*[]byte
	targets []*transport.PhysEntry
}

var _ transport.Sink = (*sender)(nil)

// Bundle schedules a finished bundle (transport.Sink).
func (s *sender) Bundle(buf *[]byte, dest stack.Address) { s.add(buf, dest) }

// Flush writes the bundles scheduled (transport.Sink).
func (s *sender) Flush() { s.flush() }

// add schedules buf for dest: the multicast group, every member (ip_mcast
// = false), or one member's physical address. An unknown address asks
// discovery and counts the drop.
func (s *sender) add(buf *[]byte, dest stack.Address) {
	s.bufs = append(s.bufs, buf)
	u := s.u
	switch {
	case dest.IsZero() && u.cfg.IPMcast:
		s.push(*buf, u.group)
	case dest.IsZero():
		s.targets = u.cache.Targets(u.LocalAddress(), s.targets)
		for _, e := range s.targets {
			s.push(*buf, e.UDP)
		}
		clear(s.targets)
	default:
		e := u.cache.Get(dest)
		if e == nil {
			u.droppedNoPhys.Add(1)
			u.askWhoHas(dest)
			return
		}
		s.push(*buf, e.UDP)
	}
}

// hasGroup reports whether ms hold a group datagram.
func (s *sender) hasGroup(ms []ipv4.Message) bool {
	for i := range ms {
		if ms[i].Addr == s.u.group {
			return true
		}
	}
	return false
}

// wroteGroup counts the group datagrams among ms, written, for the
// echoPacer.
func (s *sender) wroteGroup(ms []ipv4.Message) {
	var n int
	for i := range ms {
		if ms[i].Addr == s.u.group {
			n += len(ms[i].Buffers[0])
		}
	}
	if n > 0 {
		s.u.echo.wrote(n)
	}
}

func (s *sender) push(b []byte, to net.Addr) {
	s.msgs = append(s.msgs, ipv4.Message{Buffers: [][]byte{b}, Addr: to})
}

// flush writes everything added and returns the buffers to the pool.
func (s *sender) flush() {
	u := s.u
	batch := u.cfg.BatchSize
	for i := 0; i < len(s.msgs); {
		j := min(i+batch, len(s.msgs))
		if s.paced && s.hasGroup(s.msgs[i:j]) {
			if limit := u.echoLimit(); limit > 0 {
				u.echo.limit.Store(limit)
				u.echo.wait(u.Done())
			}
		}
		n, err := u.upc.WriteBatch(s.msgs[i:j], 0)
		u.sendCalls.Add(1)
		if n > 0 {
			u.datagramsSent.Add(int64(n))
			if s.paced {
				s.wroteGroup(s.msgs[i : i+n])
			}
			i += n
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				break
			}
			u.socketErrors.Add(1)
			i++ // skip the datagram that failed
		}
	}
	for i := range s.msgs {
		s.msgs[i] = ipv4.Message{}
	}
	s.msgs = s.msgs[:0]
	for i, b := range s.bufs {
		u.bufs.Put(b)
		s.bufs[i] = nil
	}
	s.bufs = s.bufs[:0]
}
