package tcp

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/transport"
)

// frame is one bundle queued for one or more peers; its buffer goes back
// to the pool when the last of them has written it.
type frame struct {
	buf  *[]byte
	refs atomic.Int32
	pool *transport.BufPool
}

func newFrame(buf *[]byte, refs int, pool *transport.BufPool) *frame {
	f := &frame{buf: buf, pool: pool}
	f.refs.Store(int32(refs))
	return f
}

func (f *frame) release() {
	if f.refs.Add(-1) == 0 {
		f.pool.Put(f.buf)
	}
}

// conn is one TCP (or TLS) connection to a peer, keyed by the peer's
// listening address.
type conn struct {
	nc      net.Conn // what frames go through (a *tls.Conn with TLS)
	raw     net.Conn // the socket
	peer    netip.AddrPort
	dialled bool // this member dialled it
	p       *peer
	bw      *bufio.Writer // the peer's writer's only
	once    sync.Once

	// Under TCP.mu.
	adopted bool // a writer has used it
	demoted bool // another connection to the peer won
}

func (c *conn) closeWrite() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// writeFrames writes frames: on a plain TCP connection with one writev of
// their length prefixes and bundles (no copy), through TLS via the
// buffered writer.
func (c *conn) writeFrames(frames []*frame, w *batchBufs) error {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		w.iov = w.iov[:0]
		for i, f := range frames {
			binary.BigEndian.PutUint32(w.hdrs[i][:], uint32(len(*f.buf)))
			w.iov = append(w.iov, w.hdrs[i][:], *f.buf)
		}
		nb := net.Buffers(w.iov)
		_, err := nb.WriteTo(tc)
		clear(w.iov)
		return err
	}
	for _, f := range frames {
		if err := c.writeFrame(f); err != nil {
			return err
		}
	}
	return c.bw.Flush()
}

// maxBatch is the most frames a peer's writer sends in one write.
const maxBatch = 64

// batchBufs is a writer's scratch space for writeFrames.
type batchBufs struct {
	hdrs [maxBatch][frameHeader]byte
	iov  [][]byte
}

// writeFrame buffers f's length and bytes.
func (c *conn) writeFrame(f *frame) error {
	if c.bw == nil {
		c.bw = bufio.NewWriterSize(c.nc, 64<<10)
	}
	var h [frameHeader]byte
	if _, err := c.bw.Write(appendFrameHeader(h[:0], len(*f.buf))); err != nil {
		return err
	}
	_, err := c.bw.Write(*f.buf)
	return err
}

// peer is a member's listening address with its bounded send queue and
// the one goroutine that writes to it, so that a slow or unreachable peer
// holds up only its own queue.
type peer struct {
	t        *TCP
	addr     netip.AddrPort
	q        chan *frame
	kick     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	lastUsed atomic.Int64 // unix nanos of the last frame either way
	conn     *conn        // under TCP.mu
}

func (p *peer) touch() { p.lastUsed.Store(time.Now().UnixNano()) }

func (p *peer) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *peer) close() { p.stopOnce.Do(func() { close(p.stop) }) }

// dialBackoff is how long after a failed connect frames to the peer are
// dropped without trying again (a connect the peer makes is taken at once).
const dialBackoff = 200 * time.Millisecond

// run writes queued frames to the peer's connection, dialling one when
// there is none, and flushes whenever the queue is empty.
func (p *peer) run(done <-chan struct{}) {
	t := p.t
	var cur *conn
	var failed time.Time
	batch := make([]*frame, 0, maxBatch)
	var bufs batchBufs
	defer func() {
		for {
			select {
			case f := <-p.q:
				f.release()
			default:
				return
			}
		}
	}()
	for {
		var f *frame
		select {
		case <-done:
			return
		case <-p.stop:
			return
		case <-p.kick:
		case f = <-p.q:
		}
		if c := t.current(p); c != cur {
			if cur != nil {
				if cur.bw != nil {
					_ = cur.bw.Flush()
				}
				cur.closeWrite() // demoted: the peer's reader drains it
			}
			cur = c
		}
		if f == nil {
			continue
		}
		if cur == nil {
			if !failed.IsZero() && time.Since(failed) < dialBackoff {
				t.droppedUnreach.Add(1)
				f.release()
				continue
			}
			if t.dial(p) == nil {
				failed = time.Now()
				t.droppedUnreach.Add(1)
				f.release()
				continue
			}
			cur = t.current(p)
			failed = time.Time{}
		}
		p.touch()
		batch = append(batch[:0], f)
	more:
		for len(batch) < maxBatch {
			select {
			case f = <-p.q:
				batch = append(batch, f)
			default:
				break more
			}
		}
		err := cur.writeFrames(batch, &bufs)
		n := int64(len(batch))
		for i, f := range batch {
			f.release()
			batch[i] = nil
		}
		if err != nil {
			t.writeErrors.Add(1)
			t.closeConn(cur)
			cur = nil
			continue
		}
		t.framesSent.Add(n)
	}
}
