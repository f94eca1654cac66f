// Package encrypt is ENCRYPT: authenticated encryption (AES-256-GCM) of
// whole messages, headers and payload, with a shared key that never comes
// from the config file. Every message carries the id of its key (so keys
// can be rotated: accept old and new, send with the new), a nonce made of a
// random per-instance prefix and a per-lane counter (never reused), and is
// checked against a replay window per sender and lane, so a recorded
// datagram is not delivered twice. The time it was sealed and the sender's
// network address are authenticated too: an earlier run's traffic is
// refused as stale (max_age), and a datagram relayed from another address
// does not open. A message that fails any check is dropped and counted;
// nothing of it reaches the layers above.
//
// ENCRYPT is the stack's SourceAuthenticator: with it, the transport
// learns where a member is only from messages ENCRYPT opened, never from
// the clear preamble of a datagram, so an outsider cannot redirect a
// member's traffic.
//
// Place ENCRYPT right above the transport. Its flags, source and
// destination stay in the clear (the transport needs them) but are
// authenticated; the transport's own control traffic below it is not
// protected.
package encrypt

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/secret"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures ENCRYPT. The key is read from key_file or, if that is
// empty, from the environment variable key_env: one or more keys of 32
// bytes in hex, one per line; the first is used to send, all are accepted.
type Config struct {
	KeyFile string        `toml:"key_file" doc:"file with the group key(s): 64 hex digits per line, the first sends, all are accepted"`
	KeyEnv  string        `toml:"key_env" doc:"environment variable with the key(s), used when key_file is empty (same format, lines or commas)"`
	Window  int           `toml:"replay_window" doc:"messages per sender a late message may lag the newest and still be accepted once"`
	MaxAge  time.Duration `toml:"max_age" doc:"a message sealed longer ago than this (by the sender's clock) is dropped: an earlier run's traffic, replayed; 0 turns the check off"`
}

// DefaultConfig reads the key from STRATA_ENCRYPT_KEY and refuses messages
// sealed more than 2 minutes ago.
func DefaultConfig() Config {
	return Config{KeyEnv: "STRATA_ENCRYPT_KEY", Window: 4096, MaxAge: 2 * time.Minute}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.KeyFile == "" && c.KeyEnv == "":
		return stack.BadKey("key_file", "set key_file or key_env: the key never comes from the config itself")
	case c.Window < 64 || c.Window > 1<<20 || c.Window%64 != 0:
		return stack.BadKey("replay_window", "must be a multiple of 64 in 64..1048576, got %d", c.Window)
	case c.MaxAge != 0 && c.MaxAge < time.Second:
		return stack.BadKey("max_age", "must be 0 (off) or at least 1s, got %s", c.MaxAge)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "ENCRYPT", ID: stack.IDENCRYPT,
		Doc:      "AES-256-GCM of whole messages (headers too), key ids for rotation, per-sender replay window",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDENCRYPT, Name: "ENCRYPT", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{&Header{KeyID: 7, Prefix: 9, Time: 1 << 30, Counter: 1 << 40}}
		}})
}

// Header carries what the receiver needs to open a message. All of it is
// authenticated (it is part of the additional data).
type Header struct {
	KeyID   uint32
	Prefix  uint32 // the sender instance's random nonce prefix
	Time    uint32 // when the message was sealed, Unix seconds: an earlier run's replays are too old
	Counter uint64 // the rest of the nonce; also the replay sequence
}

// Size returns the encoded length.
func (h *Header) Size() int { return 20 }

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = wire.AppendUint32(b, h.KeyID)
	b = wire.AppendUint32(b, h.Prefix)
	b = wire.AppendUint32(b, h.Time)
	return wire.AppendUint64(b, h.Counter)
}

func (h *Header) String() string {
	return fmt.Sprintf("ENCRYPT key=%08x nonce=%08x/%d t=%d", h.KeyID, h.Prefix, h.Counter, h.Time)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{KeyID: r.Uint32(), Prefix: r.Uint32(), Time: r.Uint32(), Counter: r.Uint64()}
	return h, r.Err()
}

// key is one AES-256-GCM key and its id (the first 4 bytes of its SHA-256).
type key struct {
	id   uint32
	aead cipher.AEAD
}

// KeyID returns the id a key travels under.
func KeyID(k []byte) uint32 {
	s := sha256.Sum256(k)
	return binary.BigEndian.Uint32(s[:4])
}

func newKey(k []byte) (*key, error) {
	if len(k) != 32 {
		return nil, fmt.Errorf("encrypt: a key is 32 bytes (64 hex digits), got %d bytes", len(k))
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	return &key{id: KeyID(k), aead: g}, nil
}

// ParseKeys reads keys in hex, one per line (or comma); blank lines and
// lines starting with # are skipped.
func ParseKeys(text string) ([][]byte, error) {
	var out [][]byte
	for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ',' || r == '\r' }) {
		f = strings.TrimSpace(f)
		if f == "" || strings.HasPrefix(f, "#") {
			continue
		}
		k, err := hex.DecodeString(f)
		if err != nil || len(k) != 32 {
			return nil, fmt.Errorf("encrypt: key %d: want 64 hex digits", len(out)+1)
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil, errors.New("encrypt: no key")
	}
	return out, nil
}

// Encrypt is the ENCRYPT protocol.
type Encrypt struct {
	stack.Base
	cfg Config

	mu       sync.RWMutex
	send     *key
	accept   map[uint32]*key
	prefix   uint32
	counters [3]atomic.Uint64 // per lane (regular, OOB, internal)

	rmu     sync.Mutex
	windows map[stack.Address]map[windowKey]*window

	// Set at Start, while the transport may already pass messages up.
	learner atomic.Pointer[stack.AddressLearner] // the transport, told where proven senders are
	phys    atomic.Pointer[netip.AddrPort]       // this member's network address, sealed into every message

	encrypted    atomic.Int64 `stat:"encrypted"`
	decrypted    atomic.Int64 `stat:"decrypted"`
	authFailures atomic.Int64 `stat:"auth_failures"`
	replays      atomic.Int64 `stat:"replays"`
	stale        atomic.Int64 `stat:"stale"`
	unknownKey   atomic.Int64 `stat:"unknown_key"`
	unencrypted  atomic.Int64 `stat:"unencrypted"`
	malformed    atomic.Int64 `stat:"malformed"`
}

var _ stack.SourceAuthenticator = (*Encrypt)(nil)

// AuthenticatesSources marks ENCRYPT as the layer that proves senders: the
// transport learns a member's network address only from messages ENCRYPT
// opened, never from the clear preamble of a datagram.
func (e *Encrypt) AuthenticatesSources() {}

// Start finds the transport to tell where proven senders are, and this
// member's network address (zero on a transport without one, such as SIM).
func (e *Encrypt) Start() error {
	if l, ok := e.Stack().Transport().(stack.AddressLearner); ok {
		e.learner.Store(&l)
	}
	phys, _ := stack.Ask(e.Context(), e, stack.EvGetLocalPhysicalAddress{})
	e.phys.Store(&phys)
	return nil
}

// New returns an ENCRYPT layer.
func New(cfg Config) *Encrypt {
	return &Encrypt{cfg: cfg, windows: map[stack.Address]map[windowKey]*window{}}
}

// Name returns "ENCRYPT".
func (e *Encrypt) Name() string { return "ENCRYPT" }

// Init validates the config and loads the keys.
func (e *Encrypt) Init() error {
	if err := e.cfg.Validate(); err != nil {
		return err
	}
	text, err := secret.Read(e.cfg.KeyFile, e.cfg.KeyEnv, "key_file", "key_env")
	if err != nil {
		return fmt.Errorf("encrypt: %w", err)
	}
	keys, err := ParseKeys(text)
	if err != nil {
		return err
	}
	return e.SetKeys(keys[0], keys[1:]...)
}

// SetKeys makes send the key messages are sent with, and accepts messages
// under send or any of also. To rotate without loss: add the new key to
// also on every member, then make it send on every member, then drop the
// old one.
func (e *Encrypt) SetKeys(send []byte, also ...[]byte) error {
	sk, err := newKey(send)
	if err != nil {
		return err
	}
	acc := map[uint32]*key{sk.id: sk}
	for _, k := range also {
		ak, err := newKey(k)
		if err != nil {
			return err
		}
		acc[ak.id] = ak
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.send, e.accept = sk, acc
	if e.prefix == 0 {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		e.prefix = binary.BigEndian.Uint32(b[:]) | 1
	}
	return nil
}

// aad binds the fields that stay in the clear.
// The sender's network address is bound too: a sealed datagram that
// arrives from anywhere else (an attacker relaying it from its own port
// before the original arrives) does not open, so an opened message proves
// where its sender is, and the transport may learn it.
func aad(dst []byte, h *Header, src, dest stack.Address, flags stack.Flags, phys netip.AddrPort) []byte {
	dst = h.AppendTo(dst)
	dst = stack.AppendAddress(dst, src)
	dst = stack.AppendAddress(dst, dest)
	dst = wire.AppendUint16(dst, uint16(flags))
	ip := phys.Addr().As16()
	dst = append(dst, ip[:]...)
	return wire.AppendUint16(dst, phys.Port())
}

// scratch holds a message's nonce and additional data while it is sealed
// or opened. Both escape through the cipher.AEAD interface, so they are
// pooled rather than allocated per message.
type scratch struct {
	nonce [12]byte
	ad    []byte
}

var scratches = sync.Pool{New: func() any { return &scratch{ad: make([]byte, 0, 64)} }}

// fill sets s to h's nonce and additional data.
func (s *scratch) fill(h *Header, src, dest stack.Address, flags stack.Flags, phys netip.AddrPort) {
	binary.BigEndian.PutUint32(s.nonce[:4], h.Prefix)
	binary.BigEndian.PutUint64(s.nonce[4:], h.Counter)
	s.ad = aad(s.ad[:0], h, src, dest, flags, phys)
}

// Down seals the whole message into the payload of a new one.
func (e *Encrypt) Down(ctx context.Context, m *stack.Message) error {
	e.mu.RLock()
	k, prefix := e.send, e.prefix
	e.mu.RUnlock()
	self := e.LocalAddress()
	// Each lane counts on its own (the lane in the counter's top byte, so
	// nonces stay unique): the receiver checks each lane's window apart,
	// and a backlog on one lane cannot push its messages out of the window
	// while another lane's move it on.
	l := m.Lane()
	h := &Header{KeyID: k.id, Prefix: prefix, Time: uint32(time.Now().Unix()), Counter: uint64(l)<<laneShift | e.counters[l].Add(1)}
	// The inner source is the outer one (the transport's), so it is not
	// encoded twice.
	inner := stack.AppendMessage(make([]byte, 0, m.EncodedSize(m.Src)+k.aead.Overhead()), m, m.Src)
	sc := scratches.Get().(*scratch)
	var phys netip.AddrPort
	if p := e.phys.Load(); p != nil {
		phys = *p
	}
	sc.fill(h, self, m.Dest, m.Flags, phys)
	out := stack.NewMessage(m.Dest, k.aead.Seal(inner[:0], sc.nonce[:], inner, sc.ad))
	scratches.Put(sc)
	out.Src, out.Flags = m.Src, m.Flags
	out.PutHeader(e.ID(), h)
	e.encrypted.Add(1)
	return e.PassDown(ctx, out)
}

// Up opens a message; anything that does not authenticate, is a replay, or
// is not encrypted at all is dropped and counted.
func (e *Encrypt) Up(m *stack.Message) {
	if in := e.open(m); in != nil {
		e.learn(in, netip.AddrPort{})
		e.PassUp(in)
	}
}

// UpBatch opens each message of the batch.
func (e *Encrypt) UpBatch(bt *stack.Batch) {
	keep := bt.Msgs[:0]
	var last netip.AddrPort
	for _, m := range bt.Msgs {
		if in := e.open(m); in != nil {
			last = e.learn(in, last)
			keep = append(keep, in)
		}
	}
	bt.Msgs = keep
	if len(keep) > 0 {
		e.PassUpBatch(bt)
	}
}

// learn tells the transport that in's sender, proven by opening it, is at
// the network address in came from; a batch's messages mostly share one,
// which is told once (last is the one told before).
func (e *Encrypt) learn(in *stack.Message, last netip.AddrPort) netip.AddrPort {
	if l := e.learner.Load(); l != nil && in.From.IsValid() && in.From != last {
		(*l).LearnAddress(in.Src, in.From)
	}
	return in.From
}

func (e *Encrypt) open(m *stack.Message) *stack.Message {
	h, ok := m.Header(e.ID()).(*Header)
	if !ok || m.NumHeaders() != 1 {
		e.refuse(&e.unencrypted, m.Src, "an unencrypted message")
		return nil
	}
	e.mu.RLock()
	k := e.accept[h.KeyID]
	e.mu.RUnlock()
	if k == nil {
		e.refuse(&e.unknownKey, m.Src, "a message sealed with a key it does not have")
		return nil
	}
	from := m.From
	if !from.IsValid() && m.Src == e.LocalAddress() {
		// This member's own message looped back inside the process: it
		// was sealed with this member's address. (Over the network From
		// is always set; on SIM both are zero.)
		if p := e.phys.Load(); p != nil {
			from = *p
		}
	}
	sc := scratches.Get().(*scratch)
	sc.fill(h, m.Src, m.Dest, m.Flags, from)
	pt, err := k.aead.Open(nil, sc.nonce[:], m.Payload, sc.ad)
	scratches.Put(sc)
	if err != nil {
		e.refuse(&e.authFailures, m.Src, "a message that fails authentication (forged, altered, or sealed with another key)")
		return nil
	}
	if stack.Lane(h.Counter>>laneShift) != m.Lane() {
		e.refuse(&e.malformed, m.Src, "a malformed message") // sealed for another lane: not sent as it is now
		return nil
	}
	if e.cfg.MaxAge > 0 {
		if age := time.Since(time.Unix(int64(h.Time), 0)); age > e.cfg.MaxAge || age < -e.cfg.MaxAge {
			// Sealed before this window (or after it, by a clock far
			// ahead): an earlier run's traffic, which the replay windows
			// cannot know (they start empty with every run).
			if e.stale.Add(1) == 1 {
				e.Log().Warn("encrypt: dropping a message sealed outside max_age (a replay of an earlier run, or a sender whose clock is off); later ones are only counted (stale)",
					"member", m.Src, "age", age.Truncate(time.Second), "max_age", e.cfg.MaxAge)
			}
			return nil
		}
	}
	if !e.fresh(m.Src, h) {
		e.refuse(&e.replays, m.Src, "a replayed message")
		return nil
	}
	in, err := stack.ReadMessage(wire.NewReader(pt), m.Src)
	if err != nil || in.Dest != m.Dest || in.Flags != m.Flags {
		e.refuse(&e.malformed, m.Src, "a malformed message")
		return nil
	}
	in.From = m.From
	e.decrypted.Add(1)
	return in
}

// laneShift puts the lane in the top byte of a counter.
const laneShift = 56

// windowKey names one replay window of a sender: its instance's nonce
// prefix and a lane.
type windowKey struct {
	prefix uint32
	lane   stack.Lane
}

// window is a sliding replay window of one sender instance (IPsec-style):
// the highest counter seen and a bitmap of the ones below it.
type window struct {
	hi   uint64
	bits []uint64
}

// maxWindows bounds the windows remembered per address (sender instances
// times lanes).
const maxWindows = 24

// fresh reports whether h's counter from src is new, and records it.
func (e *Encrypt) fresh(src stack.Address, h *Header) bool {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	ws := e.windows[src]
	if ws == nil {
		ws = map[windowKey]*window{}
		e.windows[src] = ws
	}
	wk := windowKey{h.Prefix, stack.Lane(h.Counter >> laneShift)}
	w := ws[wk]
	if w == nil {
		if len(ws) >= maxWindows {
			for p := range ws {
				delete(ws, p)
				break
			}
		}
		w = &window{bits: make([]uint64, e.cfg.Window/64)}
		ws[wk] = w
	}
	size := uint64(e.cfg.Window)
	c := h.Counter &^ (0xff << laneShift)
	switch {
	case c > w.hi:
		shift := c - w.hi
		if shift >= size {
			clear(w.bits)
		} else {
			for i := w.hi + 1; i <= c; i++ {
				w.clear(i % size)
			}
		}
		w.hi = c
		w.set(c % size)
		return true
	case w.hi-c >= size:
		return false // too old to tell
	case w.test(c % size):
		return false
	}
	w.set(c % size)
	return true
}

func (w *window) set(i uint64)       { w.bits[i/64] |= 1 << (i % 64) }
func (w *window) clear(i uint64)     { w.bits[i/64] &^= 1 << (i % 64) }
func (w *window) test(i uint64) bool { return w.bits[i/64]&(1<<(i%64)) != 0 }

// Stats reports ENCRYPT's counters.
func (e *Encrypt) Stats() []stack.Stat {
	return stack.CounterStats(e)
}

// refuse counts a dropped message in c and logs the first of its kind: a
// flood of forged traffic must not flood the log, and the counter (and
// strata_encrypt_*_total) keeps the count.
func (e *Encrypt) refuse(c *atomic.Int64, src stack.Address, what string) {
	if c.Add(1) == 1 {
		e.Log().Warn("encrypt: refused "+what+"; later ones are only counted", "member", src)
	}
}
