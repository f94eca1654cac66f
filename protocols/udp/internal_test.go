package udp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/strata-go/strata/internal/transport"
	"github.com/strata-go/strata/stack"
)

// FuzzReceive feeds the transport's receive path directly.
func FuzzReceive(f *testing.F) {
	src := stack.NewAddress()
	f.Add(stack.EncodeBundle(nil, "fuzz", src, true, stack.NewMessage(stack.Address{}, []byte("hello"))))
	f.Add(stack.EncodeBundle(nil, "fuzz", src, false, stack.NewMessage(stack.NewAddress(), nil)))
	f.Add([]byte{})
	u := New(DefaultConfig())
	ch, err := stack.New(stack.FromProtocols([]stack.Protocol{u}...))
	if err != nil {
		f.Fatal(err)
	}
	defer ch.Close()
	stack.Of(ch).SetCluster("fuzz")
	u.cache = transport.NewAddrCache(time.Minute, 2000)
	from := netip.MustParseAddrPort("127.0.0.1:9")
	f.Fuzz(func(t *testing.T, data []byte) {
		before := u.datagramsRecv.Load()
		u.handleDatagram(data, from)
		if u.datagramsRecv.Load() != before+1 {
			t.Fatal("datagram not counted")
		}
	})
}
