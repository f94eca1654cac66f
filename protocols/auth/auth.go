// Package auth is AUTH: a member may join only if it proves that it knows
// the group secret. The coordinator answers a JOIN_REQ with a random
// challenge; the joiner answers with an HMAC-SHA256 of the challenge and
// both addresses under the secret; only then does the JOIN_REQ reach GMS.
// The secret never travels. A joiner whose proof is wrong gets
// stack.ErrAuthFailed from Connect, and no view ever lists it.
//
// The proof goes both ways: the challenge carries the coordinator's own
// HMAC, so a joiner knows whether its coordinator holds the secret. A
// REJECT cannot be authenticated (it goes to a joiner with another
// secret), so a joiner believes it only if no challenge from that
// coordinator proved the secret within reject_grace: a REJECT forged in
// the coordinator's name cannot turn away a joiner that has the secret. Merges are
// authenticated the same way: MERGE_REQ, MERGE_RSP and INSTALL_VIEW from a
// member outside this member's view wait until it has proved itself, so a
// group with another secret never merges in. Place AUTH directly below
// GMS.
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/secret"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures AUTH. The secret is read from secret_file or, if that
// is empty, from the environment variable secret_env; never from the config.
type Config struct {
	SecretFile string        `toml:"secret_file" doc:"file holding the group secret"`
	SecretEnv  string        `toml:"secret_env" doc:"environment variable holding the group secret, used when secret_file is empty"`
	Timeout    time.Duration `toml:"challenge_timeout" doc:"how long a coordinator keeps a challenged JOIN_REQ waiting for its answer"`
	Grace      time.Duration `toml:"reject_grace" doc:"how long a joiner waits, after a REJECT, for a challenge proving the coordinator knows the secret, before it believes the REJECT"`
}

// DefaultConfig reads the secret from STRATA_AUTH_SECRET.
func DefaultConfig() Config {
	return Config{SecretEnv: "STRATA_AUTH_SECRET", Timeout: 5 * time.Second, Grace: time.Second}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.SecretFile == "" && c.SecretEnv == "":
		return stack.BadKey("secret_file", "set secret_file or secret_env: the secret never comes from the config itself")
	case c.Timeout <= 0:
		return stack.BadKey("challenge_timeout", "must be > 0, got %s", c.Timeout)
	case c.Grace <= 0:
		return stack.BadKey("reject_grace", "must be > 0, got %s", c.Grace)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "AUTH", ID: stack.IDAUTH,
		RequiresAbove: []stack.Service{stack.ServiceMembership},
		Doc:           "joiners prove they know the group secret (HMAC challenge-response); the secret never travels",
		Defaults:      DefaultConfig,
		New:           func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDAUTH, Name: "AUTH", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{&Header{Type: typeChallenge, Nonce: make([]byte, nonceLen), MAC: make([]byte, sha256.Size)},
				&Header{Type: typeResponse, Nonce: make([]byte, nonceLen), MAC: make([]byte, sha256.Size)}, &Header{Type: typeReject}}
		}})
}

const (
	typeChallenge uint8 = 1 // coordinator -> joiner: prove it (and the coordinator's own proof)
	typeResponse  uint8 = 2 // joiner -> coordinator: the proof
	typeReject    uint8 = 3 // coordinator -> joiner: wrong proof
	nonceLen            = 16
	maxPending          = 1024
)

// Header is an AUTH message.
type Header struct {
	Type  uint8
	Nonce []byte
	MAC   []byte
}

// Size returns the encoded length.
func (h *Header) Size() int {
	return 1 + wire.UvarintSize(uint64(len(h.Nonce))) + len(h.Nonce) + wire.UvarintSize(uint64(len(h.MAC))) + len(h.MAC)
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, h.Type)
	b = wire.AppendLenBytes(b, h.Nonce)
	return wire.AppendLenBytes(b, h.MAC)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8()}
	h.Nonce = append([]byte(nil), r.LenBytes(nonceLen, "AUTH nonce")...)
	h.MAC = append([]byte(nil), r.LenBytes(sha256.Size, "AUTH mac")...)
	if err := r.Err(); err != nil {
		return nil, err
	}
	if h.Type < typeChallenge || h.Type > typeReject {
		return nil, fmt.Errorf("%w: AUTH type %d", stack.ErrMalformed, h.Type)
	}
	return h, nil
}

type pending struct {
	nonce []byte
	req   *stack.Message
	at    time.Time
}

// Auth is the AUTH protocol.
type Auth struct {
	stack.Base
	cfg    Config
	secret []byte

	mu      sync.Mutex
	pending map[stack.Address]*pending
	trusted map[stack.Address]bool // proved the secret (members of the view are trusted too)
	proved  map[stack.Address]bool // coordinators whose challenge proved the secret
	doubted map[stack.Address]bool // coordinators whose REJECT waits out the grace

	challenges    atomic.Int64 `stat:"challenges_sent"`
	accepted      atomic.Int64 `stat:"joiners_accepted"`
	rejected      atomic.Int64 `stat:"joiners_rejected"`
	refusedHere   atomic.Int64 `stat:"rejected_here"`
	ignored       atomic.Int64 `stat:"ignored"`
	badChallenges atomic.Int64 `stat:"challenges_without_proof"`
	forgedRejects atomic.Int64 `stat:"forged_rejects_ignored"`
}

var _ stack.Protocol = (*Auth)(nil)

// New returns an AUTH layer.
func New(cfg Config) *Auth {
	return &Auth{cfg: cfg, pending: map[stack.Address]*pending{}, trusted: map[stack.Address]bool{},
		proved: map[stack.Address]bool{}, doubted: map[stack.Address]bool{}}
}

// guarded reports whether m is membership traffic that must come from a
// member that proved the secret, and whether its sender has.
func (a *Auth) guarded(m *stack.Message) (guard, ok bool) {
	gh, isGMS := m.Header(stack.IDGMS).(stack.MembershipHeader)
	if !isGMS || m.Src == a.LocalAddress() {
		return false, true
	}
	switch gh.Membership() {
	case stack.MembershipJoinRequest:
		return true, false // a joiner proves itself on every join
	case stack.MembershipMerge, stack.MembershipInstall:
		a.mu.Lock()
		defer a.mu.Unlock()
		return true, a.trusted[m.Src] || a.View().Contains(m.Src)
	}
	return false, true
}

// Name returns "AUTH".
func (a *Auth) Name() string { return "AUTH" }

// Init validates the config and reads the secret.
func (a *Auth) Init() error {
	if err := a.cfg.Validate(); err != nil {
		return err
	}
	if a.secret != nil {
		return nil
	}
	s, err := secret.Read(a.cfg.SecretFile, a.cfg.SecretEnv, "secret_file", "secret_env")
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return a.SetSecret([]byte(strings.TrimSpace(s)))
}

// SetSecret sets the group secret (at least 16 bytes).
func (a *Auth) SetSecret(s []byte) error {
	if len(s) < 16 {
		return fmt.Errorf("auth: the secret must be at least 16 bytes, got %d", len(s))
	}
	a.mu.Lock()
	a.secret = append([]byte(nil), s...)
	a.mu.Unlock()
	return nil
}

// Labels keep the joiner's and the coordinator's proofs apart.
const (
	joinerProof = "strata-auth-join"
	coordProof  = "strata-auth-challenge"
)

// proof is HMAC-SHA256(secret, label | nonce | joiner | coordinator).
func (a *Auth) proof(label string, nonce []byte, joiner, coord stack.Address) []byte {
	a.mu.Lock()
	mac := hmac.New(sha256.New, a.secret)
	a.mu.Unlock()
	mac.Write([]byte(label))
	mac.Write(nonce)
	mac.Write(stack.AppendAddress(nil, joiner))
	mac.Write(stack.AppendAddress(nil, coord))
	return mac.Sum(nil)
}

func (a *Auth) send(to stack.Address, h *Header) {
	m := stack.NewMessage(to, nil).Set(stack.Internal | stack.OOB)
	m.PutHeader(a.ID(), h)
	_ = a.PassDown(a.Context(), m)
}

// Up holds JOIN_REQs until their sender has proved itself, and runs the
// challenge-response.
func (a *Auth) Up(m *stack.Message) {
	if h, ok := m.Header(a.ID()).(*Header); ok {
		a.handle(m.Src, h)
		return
	}
	if guard, ok := a.guarded(m); guard && !ok {
		a.challenge(m)
		return
	}
	a.PassUp(m)
}

// PreservesBatches marks AUTH as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*Auth) PreservesBatches() {}

// UpBatch runs each message.
func (a *Auth) UpBatch(bt *stack.Batch) {
	a.UpBatchInOrder(bt, func(m *stack.Message) bool {
		_, mine := m.Header(a.ID()).(*Header)
		guard, ok := a.guarded(m)
		return mine || guard && !ok
	}, a.Up)
}

func (a *Auth) challenge(m *stack.Message) {
	nonce := make([]byte, nonceLen)
	_, _ = rand.Read(nonce)
	now := time.Now()
	a.mu.Lock()
	for src, p := range a.pending {
		if now.Sub(p.at) > a.cfg.Timeout {
			delete(a.pending, src)
		}
	}
	if len(a.pending) >= maxPending {
		a.mu.Unlock()
		a.ignored.Add(1)
		return
	}
	a.pending[m.Src] = &pending{nonce: nonce, req: m, at: now}
	a.mu.Unlock()
	a.challenges.Add(1)
	a.send(m.Src, &Header{Type: typeChallenge, Nonce: nonce, MAC: a.proof(coordProof, nonce, m.Src, a.LocalAddress())})
}

func (a *Auth) handle(src stack.Address, h *Header) {
	self := a.LocalAddress()
	switch h.Type {
	case typeChallenge:
		if len(h.Nonce) != nonceLen {
			a.ignored.Add(1)
			return
		}
		if hmac.Equal(h.MAC, a.proof(coordProof, h.Nonce, self, src)) {
			a.mu.Lock()
			if len(a.proved) >= maxPending {
				clear(a.proved)
			}
			a.proved[src] = true
			a.mu.Unlock()
		} else {
			// Forged, or a coordinator with another secret: answer all the
			// same, so the latter can refuse us.
			a.badChallenges.Add(1)
		}
		a.send(src, &Header{Type: typeResponse, Nonce: h.Nonce, MAC: a.proof(joinerProof, h.Nonce, self, src)})
	case typeResponse:
		a.mu.Lock()
		p := a.pending[src]
		if p == nil || !hmac.Equal(p.nonce, h.Nonce) {
			a.mu.Unlock()
			a.ignored.Add(1)
			return
		}
		delete(a.pending, src)
		a.mu.Unlock()
		if !hmac.Equal(h.MAC, a.proof(joinerProof, p.nonce, src, self)) {
			a.rejected.Add(1)
			a.Log().Warn("auth: a joiner failed to prove it knows the group secret", "member", src)
			a.send(src, &Header{Type: typeReject})
			return
		}
		a.accepted.Add(1)
		a.mu.Lock()
		if len(a.trusted) >= maxPending {
			clear(a.trusted)
		}
		a.trusted[src] = true
		a.mu.Unlock()
		a.PassUp(p.req)
	case typeReject:
		a.refusedHere.Add(1)
		if a.joined() {
			return // a merge was refused; GMS's merge times out
		}
		a.mu.Lock()
		wait := !a.doubted[src] && len(a.doubted) < maxPending
		if wait {
			a.doubted[src] = true
		}
		a.mu.Unlock()
		if !wait {
			a.ignored.Add(1) // one REJECT per coordinator is weighed at a time
			return
		}
		a.Go(func(done <-chan struct{}) { a.weighReject(src, done) })
	}
}

// weighReject believes src's REJECT after the grace, unless src proved it
// knows the secret meanwhile (then the REJECT was forged) or this member
// has joined.
func (a *Auth) weighReject(src stack.Address, done <-chan struct{}) {
	t := time.NewTimer(a.cfg.Grace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-done:
		return
	}
	a.mu.Lock()
	delete(a.doubted, src)
	forged := a.proved[src]
	a.mu.Unlock()
	if forged || a.joined() {
		if a.forgedRejects.Add(1) == 1 {
			a.Log().Warn("auth: ignored a REJECT from a member that has not proved the group secret (forged); later ones are only counted", "member", src)
		}
		return
	}
	_, _ = a.PassUpEvent(stack.EvJoinRefused{By: src, Reason: stack.ErrAuthFailed})
}

func (a *Auth) joined() bool { return a.View() != nil }

// Stats reports AUTH's counters.
func (a *Auth) Stats() []stack.Stat {
	return stack.CounterStats(a)
}
