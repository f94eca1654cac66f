// Package statetransfer is STATE_TRANSFER: Channel.GetState streams the
// application state from a provider's StateHandler.GetState(io.Writer) to
// the requester's SetState(io.Reader) in chunks, with a credit window, so a
// state of any size is never held in memory at once: the provider writes
// only as fast as the requester reads. Channel.GetState runs it inside a
// flush when FLUSH is in the stack.
package statetransfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures STATE_TRANSFER.
type Config struct {
	ChunkSize stack.Size    `toml:"chunk_size" doc:"bytes of state per message"`
	Window    int           `toml:"window" doc:"chunks the provider may send ahead of what the requester has read"`
	Timeout   time.Duration `toml:"timeout" doc:"a transfer that makes no progress for this long fails"`
}

// DefaultConfig returns STATE_TRANSFER's defaults.
func DefaultConfig() Config { return Config{ChunkSize: 32_000, Window: 16, Timeout: 10 * time.Second} }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.ChunkSize < 1 || c.ChunkSize > stack.MaxPayload:
		return stack.BadKey("chunk_size", "must be 1..%d, got %d", stack.MaxPayload, c.ChunkSize)
	case c.Window < 1 || c.Window > 1<<16:
		return stack.BadKey("window", "must be 1..65536, got %d", c.Window)
	case c.Timeout <= 0:
		return stack.BadKey("timeout", "must be > 0, got %s", c.Timeout)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "STATE_TRANSFER", ID: stack.IDStateTransfer,
		Requires: []stack.Service{stack.ServiceMembership},
		Doc:      "streams application state to a requester in chunks under a credit window (Channel.GetState)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDStateTransfer, Name: "STATE_TRANSFER", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{
				&Header{Type: typeReq, ID: 1}, &Header{Type: typeChunk, ID: 2}, &Header{Type: typeCredit, ID: 3, N: 8},
				&Header{Type: typeEnd, ID: 4}, &Header{Type: typeEnd, ID: 5, Err: "disk on fire"}, &Header{Type: typeCancel, ID: 6},
			}
		},
	})
}

const (
	typeReq    uint8 = 1 // requester -> provider
	typeChunk  uint8 = 2 // provider -> requester: payload is the next bytes
	typeCredit uint8 = 3 // requester -> provider: N more chunks may come
	typeEnd    uint8 = 4 // provider -> requester: done (Err: the provider's error)
	typeCancel uint8 = 5 // requester -> provider: stop
)

const maxErr = 1024

// Header is a STATE_TRANSFER message.
type Header struct {
	Type uint8
	ID   uint64
	N    uint64 // CREDIT
	Err  string // END
}

// Size returns the encoded length.
func (h *Header) Size() int {
	n := 1 + wire.UvarintSize(h.ID)
	switch h.Type {
	case typeCredit:
		n += wire.UvarintSize(h.N)
	case typeEnd:
		n += wire.UvarintSize(uint64(len(h.Err))) + len(h.Err)
	}
	return n
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, h.Type)
	b = wire.AppendUvarint(b, h.ID)
	switch h.Type {
	case typeCredit:
		b = wire.AppendUvarint(b, h.N)
	case typeEnd:
		b = wire.AppendString(b, h.Err)
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8(), ID: r.Uvarint()}
	switch h.Type {
	case typeReq, typeChunk, typeCancel:
	case typeCredit:
		h.N = r.Uvarint()
	case typeEnd:
		h.Err = r.String(maxErr, "state transfer error")
	default:
		r.Fail("STATE_TRANSFER type %d", h.Type)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

type key struct {
	peer stack.Address
	id   uint64
}

// incoming is a transfer this member requested.
type incoming struct {
	from   stack.Address
	chunks chan []byte // at most window in flight
	end    chan error  // the provider's END
}

// outgoing is a transfer this member provides.
type outgoing struct {
	mu      sync.Mutex
	allowed uint64        // chunks the requester allows in all: the window plus what it has read
	sent    uint64        // chunks sent
	more    chan struct{} // a CREDIT raised allowed
	cancel  chan struct{}
	once    sync.Once
}

// StateTransfer is the STATE_TRANSFER protocol.
type StateTransfer struct {
	stack.Base
	cfg Config

	mu   sync.Mutex
	next uint64
	in   map[uint64]*incoming
	out  map[key]*outgoing

	provided       atomic.Int64 `stat:"states_provided"`
	requested      atomic.Int64 `stat:"states_requested"`
	bytesSent      atomic.Int64 `stat:"bytes_sent"`
	bytesRecv      atomic.Int64 `stat:"bytes_received"`
	failures       atomic.Int64 `stat:"failures"`
	protocolErrors atomic.Int64 `stat:"protocol_errors"`
}

var _ stack.Protocol = (*StateTransfer)(nil)

// New returns a STATE_TRANSFER layer.
func New(cfg Config) *StateTransfer {
	return &StateTransfer{cfg: cfg, in: map[uint64]*incoming{}, out: map[key]*outgoing{}}
}

// Name returns "STATE_TRANSFER".
func (s *StateTransfer) Name() string { return "STATE_TRANSFER" }

// TransfersState marks STATE_TRANSFER as the stack's stack.StateTransferer.
func (s *StateTransfer) TransfersState() {}

var _ stack.StateTransferer = (*StateTransfer)(nil)

// Init validates the config.
func (s *StateTransfer) Init() error { return s.cfg.Validate() }

func (s *StateTransfer) send(dest stack.Address, h *Header, payload []byte) {
	flags := stack.OOB | stack.Internal
	if h.Type == typeChunk {
		flags = 0 // in order, on the regular lane: chunks are data
	}
	m := stack.NewMessage(dest, payload).Set(flags)
	m.PutHeader(s.ID(), h)
	_ = s.PassDown(s.Context(), m)
}

// ErrNoProvider is returned by GetState when there is no other member to
// ask.
var ErrNoProvider = errors.New("statetransfer: no member to fetch the state from")

// GetState fetches the state from member from (zero: the coordinator, or
// the next member if this one coordinates) into the application's SetState.
func (s *StateTransfer) GetState(ctx context.Context, from stack.Address) error {
	self := s.LocalAddress()
	v := s.View()
	s.mu.Lock()
	if from.IsZero() && v != nil {
		for _, m := range v.Members {
			if m != self {
				from = m
				break
			}
		}
	}
	if from.IsZero() || from == self {
		s.mu.Unlock()
		return ErrNoProvider
	}
	s.next++
	id := s.next
	in := &incoming{from: from, chunks: make(chan []byte, s.cfg.Window+1), end: make(chan error, 1)}
	s.in[id] = in
	s.mu.Unlock()
	s.requested.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.in, id)
		s.mu.Unlock()
	}()

	// The provider starts with a window of credit; more comes as we read.
	s.send(from, &Header{Type: typeReq, ID: id}, nil)
	r := &chunkReader{s: s, id: id, in: in, ctx: ctx, credit: s.cfg.Window / 2}
	_, err := s.PassUpEvent(stack.EvApplyState{R: io.Reader(r)})
	if err == nil && !r.eof {
		// SetState returned early: drain the rest so the provider ends.
		_, err = io.Copy(io.Discard, r)
	}
	if err != nil || r.err != nil {
		s.failures.Add(1)
		s.send(from, &Header{Type: typeCancel, ID: id}, nil)
		return errors.Join(err, r.err)
	}
	return nil
}

// chunkReader hands the requester's SetState the chunks as they come, and
// gives the provider credit as it reads.
type chunkReader struct {
	s      *StateTransfer
	id     uint64
	in     *incoming
	ctx    context.Context
	buf    []byte
	total  uint64 // chunks read in all
	told   uint64 // the total the provider was last told
	credit int
	eof    bool
	err    error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.eof {
			return 0, io.EOF
		}
		if r.err != nil {
			return 0, r.err
		}
		t := time.NewTimer(r.s.cfg.Timeout)
		// While it waits it says again how much it has read: CREDIT is
		// cumulative, so a repeat is harmless and a lost one costs only a
		// quarter of the timeout.
		again := time.NewTicker(r.s.cfg.Timeout / 4)
		r.await(t, again)
		t.Stop()
		again.Stop()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	r.s.bytesRecv.Add(int64(n))
	return n, nil
}

// await takes the next chunk, the end, or an error into r.
func (r *chunkReader) await(t *time.Timer, again *time.Ticker) {
	for {
		select {
		case <-again.C:
			r.s.send(r.in.from, &Header{Type: typeCredit, ID: r.id, N: r.total}, nil)
			continue
		case c := <-r.in.chunks:
			r.buf = c
			r.total++
			if r.total-r.told >= uint64(max(r.credit, 1)) {
				r.s.send(r.in.from, &Header{Type: typeCredit, ID: r.id, N: r.total}, nil)
				r.told = r.total
			}
		case err := <-r.in.end:
			// Chunks sent before END are in order before it on the regular
			// lane, but END travels out of band: take what is still queued.
			select {
			case c := <-r.in.chunks:
				r.buf = c
				r.total++
				r.in.end <- err
			default:
				if err != nil {
					r.err = fmt.Errorf("statetransfer: the provider failed: %w", err)
				} else {
					r.eof = true
				}
			}
		case <-t.C:
			r.err = fmt.Errorf("statetransfer: no data from %s within %s", r.in.from, r.s.cfg.Timeout)
		case <-r.ctx.Done():
			r.err = r.ctx.Err()
		case <-r.s.Done():
			r.err = stack.ErrClosed
		}
		return
	}
}

// provide runs the application's GetState for a requester.
func (s *StateTransfer) provide(to stack.Address, id uint64) {
	k := key{to, id}
	o := &outgoing{allowed: uint64(s.cfg.Window), more: make(chan struct{}, 1), cancel: make(chan struct{})}
	s.mu.Lock()
	if s.out[k] != nil {
		s.mu.Unlock()
		return
	}
	s.out[k] = o
	s.mu.Unlock()
	s.provided.Add(1)
	s.Go(func(done <-chan struct{}) {
		defer func() {
			s.mu.Lock()
			delete(s.out, k)
			s.mu.Unlock()
		}()
		w := &chunkWriter{s: s, to: to, id: id, o: o, done: done, buf: make([]byte, 0, int(s.cfg.ChunkSize))}
		_, err := s.PassUpEvent(stack.EvProvideState{W: io.Writer(w)})
		if err == nil {
			err = w.flush()
		}
		h := &Header{Type: typeEnd, ID: id}
		if err != nil {
			s.failures.Add(1)
			h.Err = err.Error()
			if len(h.Err) > maxErr {
				h.Err = h.Err[:maxErr]
			}
			if errors.Is(err, errCancelled) {
				return
			}
		}
		// END is INTERNAL but not OOB: UNICAST2 delivers it after the last
		// chunk, which went down before it on this goroutine.
		m := stack.NewMessage(to, nil).Set(stack.Internal)
		m.PutHeader(s.ID(), h)
		_ = s.PassDown(s.Context(), m)
	})
}

var errCancelled = errors.New("statetransfer: the requester cancelled the transfer")

// chunkWriter cuts the provider's state into chunks, each sent when the
// requester has credit for it.
type chunkWriter struct {
	s    *StateTransfer
	to   stack.Address
	id   uint64
	o    *outgoing
	done <-chan struct{}
	buf  []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p, n = p[k:], n+k
		if len(w.buf) == cap(w.buf) {
			if err := w.flush(); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	t := time.NewTimer(w.s.cfg.Timeout)
	defer t.Stop()
	for {
		w.o.mu.Lock()
		ok := w.o.sent < w.o.allowed
		if ok {
			w.o.sent++
		}
		w.o.mu.Unlock()
		if ok {
			break
		}
		select {
		case <-w.o.more:
		case <-w.o.cancel:
			return errCancelled
		case <-t.C:
			return fmt.Errorf("statetransfer: %s gave no credit within %s", w.to, w.s.cfg.Timeout)
		case <-w.done:
			return stack.ErrClosed
		}
	}
	chunk := make([]byte, len(w.buf))
	copy(chunk, w.buf)
	w.buf = w.buf[:0]
	w.s.bytesSent.Add(int64(len(chunk)))
	w.s.send(w.to, &Header{Type: typeChunk, ID: w.id}, chunk)
	return nil
}

// Up handles state messages; others pass.
func (s *StateTransfer) Up(m *stack.Message) {
	h, ok := m.Header(s.ID()).(*Header)
	if !ok {
		s.PassUp(m)
		return
	}
	s.handle(m, h)
}

func (s *StateTransfer) handle(m *stack.Message, h *Header) {
	switch h.Type {
	case typeReq:
		s.provide(m.Src, h.ID)
	case typeCredit, typeCancel:
		s.mu.Lock()
		o := s.out[key{m.Src, h.ID}]
		s.mu.Unlock()
		if o == nil {
			return
		}
		if h.Type == typeCancel {
			o.once.Do(func() { close(o.cancel) })
			return
		}
		// CREDIT says how many chunks the requester has read in all, so a
		// repeated or late one changes nothing.
		o.mu.Lock()
		if a := h.N + uint64(s.cfg.Window); a > o.allowed {
			o.allowed = a
		}
		o.mu.Unlock()
		select {
		case o.more <- struct{}{}:
		default:
		}
	case typeChunk, typeEnd:
		s.mu.Lock()
		in := s.in[h.ID]
		s.mu.Unlock()
		if in == nil || in.from != m.Src {
			s.protocolErrors.Add(1)
			return
		}
		if h.Type == typeEnd {
			var err error
			if h.Err != "" {
				err = errors.New(h.Err)
			}
			select {
			case in.end <- err:
			default:
			}
			return
		}
		select {
		case in.chunks <- m.Payload:
		default:
			// More than the window: the provider ignored our credit.
			s.protocolErrors.Add(1)
		}
	}
}

// DownEvent serves Channel.GetState.
func (s *StateTransfer) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if e, ok := ev.(stack.EvGetState); ok {
		return stack.Answer{}, s.GetState(ctx, e.From)
	}
	return s.PassDownEvent(ctx, ev)
}

// Stats reports STATE_TRANSFER's counters.
func (s *StateTransfer) Stats() []stack.Stat {
	return stack.CounterStats(s)
}
