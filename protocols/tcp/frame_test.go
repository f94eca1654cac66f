package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFrameRoundTripAndBounds(t *testing.T) {
	var b []byte
	b = appendFrameHeader(b, 3)
	b = append(b, 1, 2, 3)
	got, err := readFrame(bytes.NewReader(b), 3)
	require.NoError(t, err)
	require.Equal(t, []byte{1, 2, 3}, got)

	_, err = readFrame(bytes.NewReader(b), 2)
	require.ErrorIs(t, err, errBadFrame, "a frame above the bound is refused")
	_, err = readFrame(bytes.NewReader(appendFrameHeader(nil, 0)), 10)
	require.ErrorIs(t, err, errBadFrame, "an empty frame is refused")
	_, err = readFrame(bytes.NewReader(b[:5]), 10)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated frame is an error")
	_, err = readFrame(bytes.NewReader(b[:2]), 10)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a truncated length is an error")
}

// TestOversizedFrameAllocatesNothing: a peer that announces a 4GB frame
// makes the reader allocate nothing before it is refused.
func TestOversizedFrameAllocatesNothing(t *testing.T) {
	hdr := binary.BigEndian.AppendUint32(nil, 0xFFFFFFF0)
	r := bytes.NewReader(hdr)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		r.Reset(hdr)
		if _, err := readFrame(r, 64000); !errors.Is(err, errBadFrame) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(100*1024), "the error's few bytes per frame, never the frame")
}

func TestHelloRoundTrip(t *testing.T) {
	for _, s := range []string{"127.0.0.1:7800", "[::1]:7801", "10.1.2.3:65535"} {
		ap := netip.MustParseAddrPort(s)
		got, err := readHello(bytes.NewReader(appendHello(nil, ap)))
		require.NoError(t, err)
		require.Equal(t, ap, got)
	}
	for name, b := range map[string][]byte{
		"magic":   []byte("XXXX\x01\x04\x7f\x00\x00\x01\x1e\x78"),
		"version": []byte("STCP\x02\x04\x7f\x00\x00\x01\x1e\x78"),
		"family":  []byte("STCP\x01\x05\x7f\x00\x00\x01\x1e\x78"),
		"port 0":  []byte("STCP\x01\x04\x7f\x00\x00\x01\x00\x00"),
		"any":     []byte("STCP\x01\x04\x00\x00\x00\x00\x1e\x78"),
	} {
		_, err := readHello(bytes.NewReader(b))
		require.ErrorIs(t, err, errBadHello, name)
	}
}

// FuzzFrames feeds a connection's byte stream (a preamble, then frames) to
// the decoders: they never panic, never return a frame above the bound,
// and what they accept encodes back to the same bytes.
func FuzzFrames(f *testing.F) {
	good := appendHello(nil, netip.MustParseAddrPort("127.0.0.1:7800"))
	good = appendFrameHeader(good, 5)
	good = append(good, "hello"...)
	f.Add(good)
	f.Add(good[:len(good)-2])
	f.Add(append(appendHello(nil, netip.MustParseAddrPort("[::1]:1")), 0xFF, 0xFF, 0xFF, 0xFF))
	f.Add([]byte{})
	const max = 1024
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		ap, err := readHello(r)
		if err != nil {
			return
		}
		if !bytes.Equal(appendHello(nil, ap), data[:len(data)-r.Len()]) {
			t.Fatalf("preamble %s does not encode back", ap)
		}
		for {
			fr, err := readFrame(r, max)
			if err != nil {
				return
			}
			if len(fr) == 0 || len(fr) > max {
				t.Fatalf("frame of %d bytes accepted", len(fr))
			}
		}
	})
}
