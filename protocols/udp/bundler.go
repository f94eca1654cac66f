package udp

import (
	"context"
	"errors"
	"net"

	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/stack"
)

var errQueueFull = errors.New("udp: bundler queue full")

// sendQueue is the bounded queue between senders and the bundler.
type sendQueue struct {
	ch chan *stack.Message
}

func newSendQueue(n int) *sendQueue { return &sendQueue{ch: make(chan *stack.Message, n)} }

// put queues m. When the queue is full it returns errQueueFull at once if
// drop is set, and otherwise waits for room, ctx or done.
func (q *sendQueue) put(ctx context.Context, m *stack.Message, drop bool, done <-chan struct{}) error {
	select {
	case q.ch <- m:
		return nil
	default:
	}
	if drop {
		return errQueueFull
	}
	select {
	case q.ch <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return stack.ErrClosed
	}
}

// bundler is the one goroutine that packs queued messages into datagrams,
// per destination. It sends a destination's bundle when the next message
// would make it exceed max_bundle_size, and sends everything as soon as the
// queue is drained, so a lone message waits for no timer.
type bundler struct {
	u      *UDP
	max    int
	byDest map[stack.Address]*bundle
	active []*bundle
	s      *sender
}

type bundle struct {
	dest  stack.Address
	buf   *[]byte
	count int
}

func newBundler(u *UDP) *bundler {
	return &bundler{u: u, max: int(u.cfg.BundleSize), byDest: map[stack.Address]*bundle{}, s: &sender{u: u}}
}

func (b *bundler) run(done <-chan struct{}) {
	q := b.u.queue.ch
	for {
		select {
		case <-done:
			return
		case m := <-q:
			b.add(m)
		}
	drain:
		for {
			select {
			case m := <-q:
				b.add(m)
			default:
				break drain
			}
		}
		b.flushAll()
	}
}

func (b *bundler) add(m *stack.Message) {
	local := b.u.LocalAddress()
	bd := b.byDest[m.Dest]
	if bd == nil {
		bd = &bundle{dest: m.Dest}
		b.byDest[m.Dest] = bd
	}
	size := m.EncodedSize(local)
	if bd.count > 0 && len(*bd.buf)+size > b.max {
		b.finish(bd)
	}
	if bd.count == 0 {
		if bd.buf == nil {
			b.active = append(b.active, bd)
		}
		bd.buf = b.u.getBuf()
		*bd.buf = stack.AppendBundleHeader(*bd.buf, b.u.Stack().Cluster(), local, m.IsMulticast(), 0)
	}
	*bd.buf = stack.AppendMessage(*bd.buf, m, local)
	bd.count++
}

// finish closes bd's bundle and hands it to the sender; bd stays active
// with no buffer until its next message.
func (b *bundler) finish(bd *bundle) {
	stack.PatchBundleCount(*bd.buf, bd.count)
	b.u.bundlesSent.Add(1)
	b.u.bundleMsgs.Add(int64(bd.count))
	b.u.bundleBytes.Add(int64(len(*bd.buf)))
	b.s.add(bd.buf, bd.dest)
	bd.count = 0
}

func (b *bundler) flushAll() {
	for _, bd := range b.active {
		if bd.count > 0 {
			b.finish(bd)
		}
		bd.buf = nil
	}
	b.active = b.active[:0]
	b.s.flush()
	if len(b.byDest) > 1024 {
		clear(b.byDest)
	}
}

// sender collects datagrams with their destinations and writes them with
// as few sendmmsg calls as possible.
type sender struct {
	u       *UDP
	msgs    []ipv4.Message
	bufs    []*[]byte
	targets []*physEntry
}

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
		s.targets = u.cache.targets(u.LocalAddress(), s.targets)
		for _, e := range s.targets {
			s.push(*buf, e.udp)
		}
		clear(s.targets)
	default:
		e := u.cache.get(dest)
		if e == nil {
			u.droppedNoPhys.Add(1)
			u.askWhoHas(dest)
			return
		}
		s.push(*buf, e.udp)
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
		n, err := u.upc.WriteBatch(s.msgs[i:j], 0)
		if n > 0 {
			u.datagramsSent.Add(int64(n))
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
		u.bufPool.Put(b)
		s.bufs[i] = nil
	}
	s.bufs = s.bufs[:0]
}
