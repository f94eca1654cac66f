// Package compress is COMPRESS: it compresses message payloads above
// min_size with klauspost/compress (s2 by default, zstd for a better ratio
// at a higher cost), never makes a message larger (an incompressible
// payload goes as it is), and refuses to expand a received payload beyond
// max_size, so a small hostile message cannot decompress to gigabytes.
package compress

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures COMPRESS.
type Config struct {
	MinSize stack.Size `toml:"min_size" doc:"payloads smaller than this are sent as they are"`
	MaxSize stack.Size `toml:"max_size" doc:"largest payload a received message may decompress to; larger ones are dropped and counted"`
	Codec   string     `toml:"codec" doc:"s2 (fast, the default) or zstd (smaller, slower)"`
}

// DefaultConfig returns COMPRESS's defaults.
func DefaultConfig() Config { return Config{MinSize: 500, MaxSize: 16 << 20, Codec: "s2"} }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.MinSize < 0:
		return stack.BadKey("min_size", "must not be negative, got %d", c.MinSize)
	case c.MaxSize < 1 || c.MaxSize > stack.MaxPayload:
		return stack.BadKey("max_size", "must be 1..%d, got %d", stack.MaxPayload, c.MaxSize)
	case c.Codec != "s2" && c.Codec != "zstd":
		return stack.BadKey("codec", "must be s2 or zstd, got %q", c.Codec)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "COMPRESS", ID: stack.IDCOMPRESS,
		Doc:      "compresses payloads above min_size (s2 or zstd), never grows a message, caps the decompressed size",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDCOMPRESS, Name: "COMPRESS", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{&Header{Codec: codecS2, Len: 1000}, &Header{Codec: codecZstd, Len: 1 << 20}}
		}})
}

const (
	codecS2   uint8 = 1
	codecZstd uint8 = 2
)

// Header marks a compressed payload: its codec and its length before.
type Header struct {
	Codec uint8
	Len   uint64
}

// Size returns the encoded length.
func (h *Header) Size() int { return 1 + wire.UvarintSize(h.Len) }

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte { return wire.AppendUvarint(append(b, h.Codec), h.Len) }

func (h *Header) String() string { return fmt.Sprintf("COMPRESS codec=%d len=%d", h.Codec, h.Len) }

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Codec: r.Uint8(), Len: r.Uvarint()}
	if err := r.Err(); err != nil {
		return nil, err
	}
	if h.Codec != codecS2 && h.Codec != codecZstd {
		return nil, fmt.Errorf("%w: COMPRESS codec %d", stack.ErrMalformed, h.Codec)
	}
	return h, nil
}

// Compress is the COMPRESS protocol.
type Compress struct {
	stack.Base
	cfg Config

	once sync.Once
	enc  *zstd.Encoder // safe for concurrent EncodeAll
	dec  *zstd.Decoder // safe for concurrent DecodeAll

	compressed   atomic.Int64 `stat:"compressed"`
	skipped      atomic.Int64 `stat:"sent_uncompressed"`
	bytesIn      atomic.Int64 `stat:"bytes_before"`
	bytesOut     atomic.Int64 `stat:"bytes_after"`
	decompressed atomic.Int64 `stat:"decompressed"`
	rejected     atomic.Int64 `stat:"rejected"`
}

var _ stack.Protocol = (*Compress)(nil)

// New returns a COMPRESS layer.
func New(cfg Config) *Compress { return &Compress{cfg: cfg} }

// Name returns "COMPRESS".
func (c *Compress) Name() string { return "COMPRESS" }

// Init validates the config and makes the zstd coder once.
func (c *Compress) Init() error {
	if err := c.cfg.Validate(); err != nil {
		return err
	}
	var err error
	c.once.Do(func() {
		c.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err != nil {
			return
		}
		c.dec, err = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(uint64(c.cfg.MaxSize)), zstd.WithDecoderConcurrency(0))
	})
	return err
}

// Close releases the zstd coders.
func (c *Compress) Close() error {
	if c.dec != nil {
		c.dec.Close()
	}
	if c.enc != nil {
		_ = c.enc.Close()
	}
	return nil
}

// Down compresses payloads of at least min_size when that makes them
// smaller.
func (c *Compress) Down(ctx context.Context, m *stack.Message) error {
	n := len(m.Payload)
	if n == 0 || n < int(c.cfg.MinSize) || m.Header(c.ID()) != nil {
		return c.PassDown(ctx, m)
	}
	var out []byte
	codec := codecS2
	if c.cfg.Codec == "zstd" {
		codec = codecZstd
		out = c.enc.EncodeAll(m.Payload, make([]byte, 0, n))
	} else {
		out = s2.Encode(nil, m.Payload)
	}
	if len(out)+(&Header{Codec: codec, Len: uint64(n)}).Size() >= n {
		c.skipped.Add(1) // it would not get smaller
		return c.PassDown(ctx, m)
	}
	c.compressed.Add(1)
	c.bytesIn.Add(int64(n))
	c.bytesOut.Add(int64(len(out)))
	// A copy: a layer above may keep m for retransmission and read it from
	// another goroutine meanwhile.
	cm := m.Copy()
	cm.Payload = out
	cm.PutHeader(c.ID(), &Header{Codec: codec, Len: uint64(n)})
	return c.PassDown(ctx, cm)
}

// Up decompresses; a payload that claims or decodes to more than max_size,
// or does not decode to the length it claims, is dropped and counted.
func (c *Compress) Up(m *stack.Message) {
	if up := c.restore(m); up != nil {
		c.PassUp(up)
	}
}

// UpBatch decompresses each message of the batch.
func (c *Compress) UpBatch(bt *stack.Batch) {
	keep := bt.Msgs[:0]
	for _, m := range bt.Msgs {
		if up := c.restore(m); up != nil {
			keep = append(keep, up)
		}
	}
	bt.Msgs = keep
	if len(bt.Msgs) > 0 {
		c.PassUpBatch(bt)
	}
}

// restore returns m, or a decompressed copy of it (the layers below may
// keep m for retransmission), or nil if it must be dropped.
func (c *Compress) restore(m *stack.Message) *stack.Message {
	h, ok := m.Header(c.ID()).(*Header)
	if !ok {
		return m
	}
	p, err := c.decode(h, m.Payload)
	if err != nil {
		c.rejected.Add(1)
		c.Log().Debug("compress: dropped a message", "from", m.Src, "error", err)
		return nil
	}
	c.decompressed.Add(1)
	up := m.Copy()
	up.RemoveHeader(c.ID())
	up.Payload = p
	return up
}

func (c *Compress) decode(h *Header, p []byte) ([]byte, error) {
	if h.Len > uint64(c.cfg.MaxSize) {
		return nil, fmt.Errorf("claims %d bytes, more than max_size %d", h.Len, c.cfg.MaxSize)
	}
	switch h.Codec {
	case codecS2:
		n, err := s2.DecodedLen(p)
		if err != nil {
			return nil, err
		}
		if uint64(n) != h.Len {
			return nil, fmt.Errorf("decodes to %d bytes, claims %d", n, h.Len)
		}
		return s2.Decode(make([]byte, n), p)
	case codecZstd:
		out, err := c.dec.DecodeAll(p, make([]byte, 0, h.Len))
		if err != nil {
			return nil, err
		}
		if uint64(len(out)) != h.Len {
			return nil, fmt.Errorf("decoded to %d bytes, claims %d", len(out), h.Len)
		}
		return out, nil
	}
	return nil, fmt.Errorf("codec %d", h.Codec)
}

// Stats reports COMPRESS's counters.
func (c *Compress) Stats() []stack.Stat {
	return stack.CounterStats(c)
}
