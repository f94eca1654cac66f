package tcp_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/tlstest"
	"github.com/strata-go/strata/protocols/tcp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func tlsConfig(f tlstest.Files) tcp.Config {
	cfg := testConfig()
	cfg.TLSEnabled = true
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile = f.Cert, f.Key, f.CA
	cfg.TLSReload = 20 * time.Millisecond
	return cfg
}

// startTLSMember starts one member with its own certificate files.
func startTLSMember(t *testing.T, name string, f tlstest.Files) *member {
	return startMember(t, name, "tls", tlsConfig(f), nil)
}

func join(t *testing.T, ms ...*member) {
	t.Helper()
	introduce(t, ms)
	var addrs []stack.Address
	var chs []*stack.Channel
	for _, m := range ms {
		addrs, chs = append(addrs, m.ch.Address()), append(chs, m.ch)
	}
	stacktest.InjectView(t, stack.NewView(addrs[0], 2, addrs...), chs...)
}

// TestTLSMembersExchangeOverTLS: members with certificates of one CA carry
// multicasts and unicasts over TLS connections.
func TestTLSMembersExchangeOverTLS(t *testing.T) {
	stacktest.CheckLeaks(t)
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ca")
	var ms []*member
	for _, name := range []string{"A", "B", "C"} {
		ms = append(ms, startTLSMember(t, name, ca.Issue(t, dir, name)))
	}
	join(t, ms...)
	var addrs []stack.Address
	for i, m := range ms {
		addrs = append(addrs, m.ch.Address())
		for seq := range 100 {
			require.NoError(t, m.ch.Send(context.Background(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, seq, 500))))
		}
	}
	for i, m := range ms {
		stacktest.WaitFor(t, wait, func() bool { return m.col.Len() == 300 }, "member %d gets every multicast", i)
		require.Empty(t, m.col.CheckExactlyOnce(addrs, 100, true))
		require.Zero(t, stacktest.Stat(t, m.tcp, "tls_handshake_failures"))
	}
}

// dialTLS connects to addr with cfg and reports whether the connection
// survives the server's verification (TLS 1.3 tells a client of a refused
// certificate only at its first read).
func dialTLS(t *testing.T, addr string, cfg *tls.Config) bool {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: wait}, "tcp4", addr, cfg)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte("STCP\x01\x04\x7f\x00\x00\x01\x00\x01")); err != nil {
		return false
	}
	_ = c.CloseWrite()
	_, err = io.Copy(io.Discard, c)
	return err == nil
}

// TestTLSRefusesPeersWithoutAValidCertificate: a client with no
// certificate, or with one of another CA, is refused and counted (client
// authentication is on by default); a client with a valid one gets
// through; the group keeps working.
func TestTLSRefusesPeersWithoutAValidCertificate(t *testing.T) {
	stacktest.CheckLeaks(t)
	dir := t.TempDir()
	ca, other := tlstest.NewCA(t, "ca"), tlstest.NewCA(t, "other")
	a := startTLSMember(t, "A", ca.Issue(t, dir, "A"))
	victim := startTLSMember(t, "B", ca.Issue(t, dir, "B"))
	join(t, a, victim)
	to := victim.tcp.PhysicalAddress().String()
	require.True(t, tcp.DefaultConfig().TLSClientAuth, "client authentication is on by default")

	good, err := tls.LoadX509KeyPair(dir+"/A.crt", dir+"/A.key")
	require.NoError(t, err)
	ff := other.Issue(t, dir, "stranger", ca)
	stranger, err := tls.LoadX509KeyPair(ff.Cert, ff.Key)
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		certs []tls.Certificate
		ok    bool
	}{
		{"no certificate", nil, false},
		{"another CA's certificate", []tls.Certificate{stranger}, false},
		{"a valid certificate", []tls.Certificate{good}, true},
	} {
		before := stacktest.Stat(t, victim.tcp, "tls_handshake_failures")
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
			// Present the certificate whatever CAs the server names (Go's
			// client would otherwise send none that the server's CAs did not sign).
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if len(c.certs) == 0 {
					return &tls.Certificate{}, nil
				}
				return &c.certs[0], nil
			}}
		got := dialTLS(t, to, cfg)
		require.Equal(t, c.ok, got, c.name)
		if !c.ok {
			stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, victim.tcp, "tls_handshake_failures") == before+1 }, "%s: refused and counted", c.name)
		}
	}
	// A plain TCP client is refused too.
	before := stacktest.Stat(t, victim.tcp, "tls_handshake_failures")
	attack(t, to, []byte("STCP\x01\x04\x7f\x00\x00\x01\x00\x01"))
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, victim.tcp, "tls_handshake_failures") == before+1 }, "plain TCP refused and counted")

	require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(victim.ch.Address(), []byte("still here"))))
	stacktest.WaitFor(t, wait, func() bool { return victim.col.Len() == 1 }, "the group keeps working")
}

// TestTLSRotatedFilesArePickedUp: a member that trusts only its CA refuses
// a peer of another CA; once its CA bundle on disk names that CA too (a
// rotation), the running member takes it, and the two exchange messages,
// with no restart.
func TestTLSRotatedFilesArePickedUp(t *testing.T) {
	stacktest.CheckLeaks(t)
	dir := t.TempDir()
	oldCA, newCA := tlstest.NewCA(t, "old"), tlstest.NewCA(t, "new")
	vf := oldCA.Issue(t, dir, "V")
	v := startTLSMember(t, "V", vf)
	p := startTLSMember(t, "P", newCA.Issue(t, dir, "P", oldCA, newCA))
	join(t, v, p)

	require.NoError(t, p.ch.Send(context.Background(), stack.NewMessage(v.ch.Address(), []byte("refused"))))
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, v.tcp, "tls_handshake_failures") >= 1 }, "V refuses P's certificate")
	require.Zero(t, v.col.Len())

	tlstest.WriteBundle(t, vf.CA, oldCA, newCA)
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, v.tcp, "tls_reloads") == 1 }, "V reloads its files")
	sent := 0
	stacktest.WaitFor(t, wait, func() bool {
		// P's writer waits out a short back-off after the refusal: send
		// until one gets through.
		if v.col.Len() == 0 {
			sent++
			_ = p.ch.Send(context.Background(), stack.NewMessage(v.ch.Address(), []byte("accepted")))
		}
		return v.col.Len() > 0
	}, "P's messages reach V after the rotation")
	require.NoError(t, v.ch.Send(context.Background(), stack.NewMessage(p.ch.Address(), []byte("back"))))
	stacktest.WaitFor(t, wait, func() bool { return p.col.Len() == 1 }, "and V's reach P")
}
