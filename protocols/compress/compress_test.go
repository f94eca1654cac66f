package compress_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/klauspost/compress/s2"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/compress"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// text is a compressible payload of n bytes (log-like lines).
func text(n int) []byte {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "time=2026-12-03T07:%02d:%02d level=INFO msg=\"member joined\" member=M%d view=%d\n", i%60, i%60, i%7, i)
	}
	return []byte(b.String()[:n])
}

func pair(t *testing.T, sender, receiver compress.Config) (*stacktest.Cluster, []*compress.Compress) {
	cs := []*compress.Compress{compress.New(sender), compress.New(receiver)}
	c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol { return []stack.Protocol{cs[i]} })
	return c, cs
}

func TestPayloadsArriveIntactAndLargeOnesCompressed(t *testing.T) {
	for _, codec := range []string{"s2", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := compress.DefaultConfig()
				cfg.Codec = codec
				c, cs := pair(t, cfg, cfg)
				rnd := make([]byte, 10_000)
				for i := range rnd {
					rnd[i] = byte(rand.Uint32())
				}
				sent := [][]byte{nil, text(100), text(499), text(500), text(1000), text(64 << 10), rnd}
				for _, p := range sent {
					require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(c.Addresses()[1], bytes.Clone(p))))
				}
				synctest.Wait()
				got := c.Recv[1].Messages()
				require.Len(t, got, len(sent))
				for i, m := range got {
					require.Equal(t, len(sent[i]), len(m.Payload), "message %d", i)
					require.True(t, bytes.Equal(sent[i], m.Payload), "message %d intact", i)
					require.Nil(t, m.Header(stack.IDCOMPRESS), "no COMPRESS header above the layer")
				}
				require.EqualValues(t, 3, stacktest.Stat(t, cs[0], "compressed"), "500 B, 1 KB and 64 KB of text")
				require.EqualValues(t, 1, stacktest.Stat(t, cs[0], "sent_uncompressed"), "random bytes would grow: sent as they are")
				require.Less(t, stacktest.Stat(t, cs[0], "bytes_after"), stacktest.Stat(t, cs[0], "bytes_before")/3)
				require.EqualValues(t, 3, stacktest.Stat(t, cs[1], "decompressed"))
			})
		})
	}
}

// TestSentMessageIsLeftAsItIs: COMPRESS sends a compressed copy, so a layer
// above that keeps the message for retransmission (NAKACK, UNICAST2) reads
// the original, unchanged, while it goes out.
func TestSentMessageIsLeftAsItIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, cs := pair(t, compress.DefaultConfig(), compress.DefaultConfig())
		p := text(4000)
		m := stack.NewMessage(c.Addresses()[1], bytes.Clone(p))
		require.NoError(t, c.Channels[0].Send(t.Context(), m))
		synctest.Wait()
		require.EqualValues(t, 1, stacktest.Stat(t, cs[0], "compressed"))
		require.Equal(t, p, m.Payload)
		require.Nil(t, m.Header(stack.IDCOMPRESS))
		require.Equal(t, 1, c.Recv[1].Len())
	})
}

// TestDecompressionBombIsRejected: 32 MB of zeros compress to a small
// message; a receiver whose max_size is 1 MB drops it and counts it, as it
// does a message that lies about its length.
func TestDecompressionBombIsRejected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := compress.DefaultConfig()
		big.MaxSize, big.MinSize = 64<<20, 0
		small := compress.DefaultConfig()
		small.MaxSize = 1 << 20
		c, cs := pair(t, big, small)
		dest := c.Addresses()[1]
		require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(dest, make([]byte, 32<<20))))
		// A header that claims 100 bytes in front of 512 KB of data.
		lie := stack.NewMessage(dest, s2.Encode(nil, make([]byte, 512<<10)))
		lie.PutHeader(stack.IDCOMPRESS, &compress.Header{Codec: 1, Len: 100})
		require.NoError(t, c.Channels[0].Send(t.Context(), lie))
		// Garbage that is not s2 at all.
		junk := stack.NewMessage(dest, []byte("not compressed at all"))
		junk.PutHeader(stack.IDCOMPRESS, &compress.Header{Codec: 2, Len: 5})
		require.NoError(t, c.Channels[0].Send(t.Context(), junk))
		require.NoError(t, c.Channels[0].Send(t.Context(), stack.NewMessage(dest, text(2000))))
		synctest.Wait()
		require.EqualValues(t, 3, stacktest.Stat(t, cs[1], "rejected"))
		got := c.Recv[1].Messages()
		require.Len(t, got, 1, "only the honest message is delivered")
		require.Equal(t, text(2000), got[0].Payload)
	})
}

func FuzzDecompress(f *testing.F) {
	f.Add(uint8(1), uint64(10), s2.Encode(nil, []byte("hello hello hello")))
	f.Add(uint8(2), uint64(100), []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0})
	f.Add(uint8(1), uint64(1<<40), []byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	cfg := compress.DefaultConfig()
	cfg.MaxSize = 1 << 20
	c := compress.New(cfg)
	if err := c.Init(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, codec uint8, n uint64, p []byte) {
		out, err := compress.DecodeForTest(c, &compress.Header{Codec: codec, Len: n}, p)
		if err == nil && (uint64(len(out)) != n || len(out) > 1<<20) {
			t.Fatalf("decoded %d bytes for a claim of %d", len(out), n)
		}
	})
}

// BenchmarkThroughput: unicasts of compressible text between two members
// on SIM, without COMPRESS and with each codec, in the same run.
func BenchmarkThroughput(b *testing.B) {
	for _, size := range []int{1000, 16 << 10} {
		for _, codec := range []string{"none", "s2", "zstd"} {
			b.Run(fmt.Sprintf("size=%d/codec=%s", size, codec), func(b *testing.B) {
				stacktest.BenchUnicastSIM(b, text(size), func() []stack.Protocol {
					if codec == "none" {
						return nil
					}
					return []stack.Protocol{compress.New(compress.Config{MinSize: 500, MaxSize: 16 << 20, Codec: codec})}
				})
			})
		}
	}
}
