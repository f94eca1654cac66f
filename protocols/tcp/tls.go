package tcp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// tlsFileError names the config key whose file could not be used.
type tlsFileError struct {
	key string
	err error
}

func (e *tlsFileError) Error() string { return e.key + ": " + e.err.Error() }

// tlsMaterial is one loaded generation of the certificate, key and CA.
type tlsMaterial struct {
	cert tls.Certificate
	pool *x509.CertPool
}

func loadTLSFiles(certFile, keyFile, caFile string) (*tlsMaterial, *tlsFileError) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, &tlsFileError{"tls_cert_file", fmt.Errorf("load %s with key %s: %w", certFile, keyFile, err)}
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, &tlsFileError{"tls_ca_file", err}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &tlsFileError{"tls_ca_file", fmt.Errorf("%s holds no PEM certificate", caFile)}
	}
	return &tlsMaterial{cert: cert, pool: pool}, nil
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{fi.ModTime(), fi.Size()}
}

// tlsReloader keeps the current certificate, key and CA, and loads them
// again when one of the files changes on disk (a cert-manager rotation):
// every new connection, in either direction, uses what is current then.
type tlsReloader struct {
	cfg    *Config
	mu     sync.Mutex
	stamps [3]fileStamp
	cur    atomic.Pointer[tlsMaterial]

	reloads, reloadErrors atomic.Int64
}

func newTLSReloader(cfg *Config) (*tlsReloader, error) {
	r := &tlsReloader{cfg: cfg}
	r.stamps = r.stampAll()
	m, ferr := loadTLSFiles(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile)
	if ferr != nil {
		return nil, ferr
	}
	r.cur.Store(m)
	return r, nil
}

func (r *tlsReloader) stampAll() [3]fileStamp {
	return [3]fileStamp{stampOf(r.cfg.TLSCertFile), stampOf(r.cfg.TLSKeyFile), stampOf(r.cfg.TLSCAFile)}
}

// check reloads the files if any changed since the last load. A set that
// does not load (a half-written rotation) keeps the old one and is tried
// again on the next check.
func (r *tlsReloader) check() {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stampAll()
	if st == r.stamps {
		return
	}
	m, ferr := loadTLSFiles(r.cfg.TLSCertFile, r.cfg.TLSKeyFile, r.cfg.TLSCAFile)
	if ferr != nil {
		r.reloadErrors.Add(1)
		return
	}
	r.stamps = st
	r.cur.Store(m)
	r.reloads.Add(1)
}

// server is the config for accepted connections: the current certificate,
// and the peer's certificate required and verified against the current CA
// (unless tls_client_auth = false).
func (r *tlsReloader) server() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := r.cur.Load()
			c := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{m.cert}, ClientCAs: m.pool, ClientAuth: tls.NoClientCert}
			if r.cfg.TLSClientAuth {
				c.ClientAuth = tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}

// client is the config for a connection this member dials: it presents the
// current certificate and verifies the peer's against the current CA, by
// tls_server_name if set, else by chain alone (peers are dialled by IP).
func (r *tlsReloader) client() *tls.Config {
	m := r.cur.Load()
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &m.cert, nil
		},
	}
	if r.cfg.TLSServerName != "" {
		c.ServerName, c.RootCAs = r.cfg.TLSServerName, m.pool
		return c
	}
	c.InsecureSkipVerify = true // verified below, against the CA, without a host name
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tcp: peer sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	return c
}
