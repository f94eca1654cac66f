package encrypt_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/encrypt"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
	"github.com/strata-go/strata/stack/wire"
)

func newKey(t testing.TB) []byte {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

// group starts members over SIM with ENCRYPT (keys[i] is member i's key)
// and NAKACK above it.
func group(t *testing.T, keys [][]byte) (*stacktest.Cluster, []*encrypt.Encrypt) {
	es := make([]*encrypt.Encrypt, len(keys))
	for i, k := range keys {
		t.Setenv(fmt.Sprint("STRATA_TEST_KEY_", i), hex.EncodeToString(k))
	}
	c := stacktest.StartSIM(t, len(keys), 1, func(i int) []stack.Protocol {
		cfg := encrypt.DefaultConfig()
		cfg.KeyEnv = fmt.Sprint("STRATA_TEST_KEY_", i)
		es[i] = encrypt.New(cfg)
		return []stack.Protocol{es[i], nakack.New(nakack.DefaultConfig())}
	})
	return c, es
}

func TestMembersWithTheKeyTalkAndOthersCanNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKey(t)
		c, es := group(t, [][]byte{k, k, newKey(t)})
		for i, ch := range c.Channels {
			require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 100))))
			require.NoError(t, ch.Send(t.Context(), stack.NewMessage(c.Addresses()[(i+1)%3], []byte(fmt.Sprint("uni", i)))))
		}
		synctest.Wait()
		addrs := c.Addresses()
		for i := range 2 {
			require.Equal(t, []int{0}, c.Recv[i].Seqs(addrs[1-i]), "member %d reads the other keyed member", i)
			require.Empty(t, c.Recv[i].Seqs(addrs[2]), "member %d gets nothing injected by the member without the key", i)
			require.Positive(t, stacktest.Stat(t, es[i], "unknown_key"))
		}
		require.Empty(t, c.Recv[2].Seqs(addrs[0]), "the member without the key reads nothing")
		require.Empty(t, c.Recv[2].Seqs(addrs[1]))
		require.Positive(t, stacktest.Stat(t, es[2], "unknown_key"))
	})
}

// capture records copies of what crosses the SIM network.
type capture struct {
	mu   sync.Mutex
	msgs []*stack.Message
}

func (c *capture) rule() sim.Rule {
	return sim.Rule{DropIf: func(m *stack.Message) bool {
		c.mu.Lock()
		c.msgs = append(c.msgs, m.Copy())
		c.mu.Unlock()
		return false
	}}
}

func TestReplayedDatagramIsDeliveredOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKey(t)
		c, es := group(t, [][]byte{k, k})
		addrs := c.Addresses()
		var cap capture
		c.Net.SetLink(addrs[0], addrs[1], cap.rule())
		require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(addrs[1], []byte("once"))))
		synctest.Wait()
		require.Len(t, cap.msgs, 1)
		// Duplicates on the wire right away, and a replay much later.
		c.Net.SetLink(addrs[0], addrs[1], sim.Rule{Duplicate: 1})
		require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(addrs[1], []byte("twice on the wire"))))
		synctest.Wait()
		time.Sleep(time.Minute)
		es[1].Up(cap.msgs[0].Copy())
		es[1].Up(cap.msgs[0].Copy())
		synctest.Wait()
		var got []string
		for _, m := range c.Recv[1].Messages() {
			got = append(got, string(m.Payload))
		}
		require.Equal(t, []string{"once", "twice on the wire"}, got)
		require.EqualValues(t, 3, stacktest.Stat(t, es[1], "replays"))
	})
}

// TestEarlierRunsTrafficIsRefused: a datagram recorded from one run of a
// group is replayed into a later run under the same key. Its sender's
// address is new to the later run's members, so their replay windows
// (which start empty) cannot know it; the time sealed in its authenticated
// header can, and it is dropped as stale before anything above ENCRYPT
// sees it.
func TestEarlierRunsTrafficIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKey(t)
		var cap capture
		first, _ := group(t, [][]byte{k, k})
		addrs := first.Addresses()
		first.Net.SetLink(addrs[0], addrs[1], cap.rule())
		require.NoError(t, first.Channels[0].Send(t.Context(), stack.NewMessage(stack.Address{}, []byte("first run"))))
		synctest.Wait()
		require.NotEmpty(t, cap.msgs)
		first.Close()

		time.Sleep(3 * time.Minute) // the next run starts later
		second, es := group(t, [][]byte{k, k})
		for _, m := range cap.msgs {
			es[1].Up(m.Copy())
		}
		synctest.Wait()
		require.Empty(t, second.Recv[1].Messages())
		require.EqualValues(t, len(cap.msgs), stacktest.Stat(t, es[1], "stale"), "every recorded message was refused as stale")
		require.Zero(t, stacktest.Stat(t, es[1], "replays"), "the replay windows did not catch them: they start empty")
	})
}

// TestFlippedBitAnywhereIsDropped flips every bit of every byte of an
// encrypted message as it travels (its encoding on the wire): each copy is
// rejected, by the wire decoder or by ENCRYPT, and none is delivered.
func TestFlippedBitAnywhereIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKey(t)
		c, es := group(t, [][]byte{k, k})
		addrs := c.Addresses()
		var cap capture
		c.Net.SetLink(addrs[0], addrs[1], sim.Rule{DropIf: func(m *stack.Message) bool {
			cap.mu.Lock()
			defer cap.mu.Unlock()
			cap.msgs = append(cap.msgs, m.Copy())
			return true
		}})
		require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(addrs[1], []byte("the secret"))))
		synctest.Wait()
		require.Len(t, cap.msgs, 1)
		enc := stack.AppendMessage(nil, cap.msgs[0], addrs[0])
		decoded, rejected := 0, 0
		for i := range enc {
			for bit := range 8 {
				b := bytes.Clone(enc)
				b[i] ^= 1 << bit
				m, err := stack.ReadMessage(wire.NewReader(b), addrs[0])
				if err != nil {
					rejected++ // the transport counts it as malformed
					continue
				}
				decoded++
				es[1].Up(m)
			}
		}
		synctest.Wait()
		require.Empty(t, c.Recv[1].Messages(), "no altered copy is delivered")
		dropped := int64(0)
		for _, n := range []string{"auth_failures", "unknown_key", "unencrypted", "replays", "malformed"} {
			dropped += stacktest.Stat(t, es[1], n)
		}
		require.EqualValues(t, decoded, dropped, "every altered copy that decodes is dropped and counted by ENCRYPT")
		require.Positive(t, decoded)
		t.Logf("%d bytes × 8 bits: %d rejected by the wire decoder, %d by ENCRYPT", len(enc), rejected, decoded)
	})
}

// TestKeyRotationLosesNothing rotates the key of a running 3-member group
// in the three steps SetKeys documents while every member multicasts.
func TestKeyRotationLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		old, fresh := newKey(t), newKey(t)
		c, es := group(t, [][]byte{old, old, old})
		var stop atomic.Bool
		var wg sync.WaitGroup
		sent := make([]int, 3)
		for i, ch := range c.Channels {
			wg.Go(func() {
				for s := 0; !stop.Load(); s++ {
					if !assert.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, 64)))) {
						return
					}
					sent[i] = s + 1
					time.Sleep(time.Millisecond)
				}
			})
		}
		step := func(f func(e *encrypt.Encrypt)) {
			for _, e := range es {
				time.Sleep(7 * time.Millisecond)
				f(e)
			}
		}
		step(func(e *encrypt.Encrypt) { require.NoError(t, e.SetKeys(old, fresh)) })
		step(func(e *encrypt.Encrypt) { require.NoError(t, e.SetKeys(fresh, old)) })
		time.Sleep(50 * time.Millisecond) // what was sent under the old key has arrived
		step(func(e *encrypt.Encrypt) { require.NoError(t, e.SetKeys(fresh)) })
		time.Sleep(20 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		synctest.Wait()
		addrs := c.Addresses()
		for i, r := range c.Recv {
			for j := range addrs {
				require.Len(t, r.Seqs(addrs[j]), sent[j], "member %d got all of member %d's", i, j)
			}
			for _, n := range []string{"auth_failures", "unknown_key"} {
				require.Zero(t, stacktest.Stat(t, es[i], n), "member %d: %s", i, n)
			}
		}
	})
}

func TestConfigNeedsAKeyFromOutsideTheConfig(t *testing.T) {
	_, err := stack.ParseConfig("e.toml", []byte("[[protocol]]\ntype = \"SIM\"\n[[protocol]]\ntype = \"ENCRYPT\"\nkey_env = \"\"\n"))
	require.ErrorContains(t, err, "key_file")
	e := encrypt.New(encrypt.Config{KeyEnv: "STRATA_NO_SUCH_KEY_VAR", Window: 64})
	require.ErrorContains(t, e.Init(), "STRATA_NO_SUCH_KEY_VAR is not set")
	_, err = encrypt.ParseKeys("abcd")
	require.ErrorContains(t, err, "64 hex digits")
}

func FuzzOpen(f *testing.F) {
	f.Add(uint32(1), uint32(2), uint32(4), uint64(3), []byte("ciphertext"))
	k := make([]byte, 32)
	e := encrypt.New(encrypt.Config{KeyEnv: "X", Window: 64})
	if err := e.SetKeys(k); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, prefix, when uint32, ctr uint64, p []byte) {
		m := stack.NewMessage(stack.Address{}, p)
		m.Src = stack.NewAddress()
		m.PutHeader(e.ID(), &encrypt.Header{KeyID: id, Prefix: prefix, Time: when, Counter: ctr})
		e.Up(m) // nothing above: it must neither panic nor pass anything up
	})
}

// BenchmarkThroughput1KB: 1 KB unicasts between two members on SIM, with
// and without ENCRYPT in the same run (the ratio is the layer's cost).
func BenchmarkThroughput1KB(b *testing.B) {
	k := newKey(b)
	for _, enc := range []bool{false, true} {
		b.Run(fmt.Sprint("encrypt=", enc), func(b *testing.B) {
			stacktest.BenchUnicastSIM(b, make([]byte, 1000), func() []stack.Protocol {
				if !enc {
					return nil
				}
				e := encrypt.New(encrypt.Config{KeyEnv: "unused", Window: 4096})
				if err := e.SetKeys(k); err != nil {
					b.Fatal(err)
				}
				return []stack.Protocol{&preKeyed{e}}
			})
		})
	}
}

// preKeyed is an ENCRYPT whose keys were set in code (Init would read the
// environment).
type preKeyed struct{ *encrypt.Encrypt }

func (p *preKeyed) Init() error { return nil }

// TestLateMessageOnOneLaneIsNotTakenForAReplay: a regular message held up
// (here: caught on the wire and handed in late) while more than a window's
// worth of internal-lane messages from the same sender arrive is still
// delivered: each lane has its own counter and window, so traffic on one
// lane does not push another's messages out of the window.
func TestLateMessageOnOneLaneIsNotTakenForAReplay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newKey(t)
		c, es := group(t, [][]byte{k, k})
		addrs := c.Addresses()
		var cap capture
		c.Net.SetLink(addrs[0], addrs[1], sim.Rule{DropIf: func(m *stack.Message) bool {
			cap.mu.Lock()
			defer cap.mu.Unlock()
			if len(cap.msgs) == 0 && m.Lane() == stack.LaneRegular {
				cap.msgs = append(cap.msgs, m.Copy())
				return true
			}
			return false
		}})
		require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(addrs[1], []byte("late"))))
		n := encrypt.DefaultConfig().Window + 100
		for i := range n {
			require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(addrs[1], stacktest.Payload(0, i, 8)).Set(stack.Internal)))
			if i%512 == 511 {
				// In steps: the internal lane's parallel workers may
				// reorder what is in flight at once, and a message a
				// whole window behind the rest is a replay.
				synctest.Wait()
			}
		}
		synctest.Wait()
		require.Equal(t, n, c.Recv[1].Len())
		require.Len(t, cap.msgs, 1)
		es[1].Up(cap.msgs[0])
		synctest.Wait()
		require.Equal(t, n+1, c.Recv[1].Len(), "the late regular message is delivered")
		require.Zero(t, stacktest.Stat(t, es[1], "replays"))
	})
}
