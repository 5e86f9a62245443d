package pki

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultReloadInterval is how often a Reloader polls its files.
const DefaultReloadInterval = time.Second

// ReloaderConfig says where a process's TLS material is and what it must be.
type ReloaderConfig struct {
	// CAFile (--tls-ca) is a PEM bundle of the CAs whose certificates the
	// process accepts from peers (one or more CERTIFICATE blocks; during a
	// CA rotation, old and new). CertFile (--tls-cert) is the process's
	// certificate (leaf first, then any intermediates), KeyFile (--tls-key)
	// its private key. All three are required.
	CAFile, CertFile, KeyFile string
	// Role and Region, when set, are what the certificate's identity must
	// say (a coordinator of eu-west loads only a region certificate of
	// eu-west); a file that says otherwise does not load.
	Role, Region string
	// Interval between polls of the files; 0 means DefaultReloadInterval.
	Interval time.Duration
	// Logger receives reloads and reload failures; nil means slog.Default().
	Logger *slog.Logger
}

// Reloader holds a process's CA bundle, certificate and key, loaded from
// files, and reloads them when the files change. Its TLS configurations
// read the material at each handshake, so a reloaded certificate or CA
// applies to every new connection without a restart; open connections keep
// what they were made with.
//
// Material that loads is a CA bundle of at least one certificate, a
// certificate and key that match, a certificate that chains to the bundle
// and is valid now, and carries an Apiary identity (and the configured role
// and region). Files that change into anything else do not load: the old
// material stays in use and the failure is logged once.
//
// Reloader is safe for concurrent use.
type Reloader struct {
	cfg ReloaderConfig
	log *slog.Logger
	cur atomic.Pointer[material]

	mu    sync.Mutex   // serializes loads
	polls atomic.Int64 // completed polls of Run, for tests
}

// material is one loaded set; never modified once stored.
type material struct {
	sum  [sha256.Size]byte // of the three files' bytes
	gen  uint64
	pool *x509.CertPool
	cert *tls.Certificate // Leaf set
	id   Identity
	// the files' bytes that loaded (PEM), for PEM
	caPEM, certPEM, keyPEM []byte
}

// NewReloader loads the files once. The error names the flag of the file at
// fault (--tls-ca, --tls-cert, --tls-key) and what is wrong with it.
// Call Start (or Run) to follow changes.
func NewReloader(cfg ReloaderConfig) (*Reloader, error) {
	switch {
	case cfg.CAFile == "":
		return nil, errors.New("--tls-ca: required (the CA bundle, e.g. apiary-ca.pem)")
	case cfg.CertFile == "":
		return nil, errors.New("--tls-cert: required (this process's certificate)")
	case cfg.KeyFile == "":
		return nil, errors.New("--tls-key: required (this process's private key)")
	case cfg.Interval < 0:
		return nil, fmt.Errorf("reload interval: must be >= 0 (got %s)", cfg.Interval)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultReloadInterval
	}
	r := &Reloader{cfg: cfg, log: cfg.Logger}
	if r.log == nil {
		r.log = slog.Default()
	}
	if _, _, err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Identity is the identity of the certificate in use.
func (r *Reloader) Identity() Identity { return r.cur.Load().id }

// NotAfter is when the certificate in use expires.
func (r *Reloader) NotAfter() time.Time { return r.cur.Load().cert.Leaf.NotAfter }

// Generation counts the loads that changed the material: 1 after
// NewReloader, +1 at each reload.
func (r *Reloader) Generation() uint64 { return r.cur.Load().gen }

// PEM returns the bytes of the CA bundle, certificate and key files as
// they were when the material in use loaded (PEM, as read; copies the
// caller may keep): never the bytes of files that changed and did not
// load. For a server that can only read TLS files itself (the embedded etcd
// member), so that it serves nothing the Reloader refused. Read Generation
// before PEM to learn, by a later Generation, that these bytes are stale.
func (r *Reloader) PEM() (ca, cert, key []byte) {
	m := r.cur.Load()
	return bytes.Clone(m.caPEM), bytes.Clone(m.certPEM), bytes.Clone(m.keyPEM)
}

// Reload reads the files now and loads them if their bytes changed. It
// returns nil when they did not change or loaded, else the error (the old
// material stays in use); it logs nothing. For a SIGHUP handler or a test.
func (r *Reloader) Reload() error {
	_, _, err := r.reload()
	return err
}

// Start runs Run in a goroutine; it ends when ctx does.
func (r *Reloader) Start(ctx context.Context) { go r.Run(ctx) }

// Run polls the files every Interval until ctx ends, reading their bytes
// (a few KB; comparing contents rather than mtimes also catches a rewrite
// within the file system's timestamp granularity). A change loads as a whole
// and is logged at INFO. A change that does not load keeps the old material;
// it is logged at WARN once, when the same bytes still fail at the next
// poll, so a rotation that writes certificate and key one after the other is
// not reported; it is retried at every poll (a certificate not yet valid
// becomes valid).
func (r *Reloader) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	var fl failLog
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sum, changed, err := r.reload()
		if err != nil {
			if fl.failed(sum) {
				cur := r.cur.Load()
				r.log.Warn("TLS files changed but do not load; keeping the loaded certificate",
					"err", err, "identity", cur.id.String(), "not_after", cur.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			r.polls.Add(1)
			continue
		}
		fl = failLog{}
		r.polls.Add(1)
		if changed {
			m := r.cur.Load()
			r.log.Info("TLS certificate and CA bundle reloaded", "identity", m.id.String(),
				"not_after", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "generation", m.gen)
		}
	}
}

// failLog decides when a failing reload is logged: once per distinct
// content of the files, at its second consecutive failing poll.
type failLog struct {
	sum      [sha256.Size]byte
	failures int
	logged   bool
}

// failed records a failing poll of the files whose bytes hash to sum and
// reports whether to log it now.
func (f *failLog) failed(sum [sha256.Size]byte) bool {
	if f.failures == 0 || sum != f.sum {
		*f = failLog{sum: sum}
	}
	f.failures++
	if f.failures >= 2 && !f.logged {
		f.logged = true
		return true
	}
	return false
}

// reload reads the files and loads them if their bytes differ from the
// material in use. sum identifies what was read (also for a read error).
func (r *Reloader) reload() (sum [sha256.Size]byte, changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	files := []struct{ flag, path string }{
		{"--tls-ca", r.cfg.CAFile}, {"--tls-cert", r.cfg.CertFile}, {"--tls-key", r.cfg.KeyFile},
	}
	h := sha256.New()
	var data [3][]byte
	var readErr error
	for i, f := range files {
		b, err := os.ReadFile(f.path)
		if err != nil && readErr == nil {
			readErr = fmt.Errorf("%s %s: %w", f.flag, f.path, err)
		}
		if err != nil {
			b = []byte("error: " + err.Error())
		}
		data[i] = b
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	copy(sum[:], h.Sum(nil))
	if readErr != nil {
		return sum, false, readErr
	}
	cur := r.cur.Load()
	if cur != nil && cur.sum == sum {
		return sum, false, nil
	}
	m, err := r.load(data[0], data[1], data[2])
	if err != nil {
		return sum, false, err
	}
	m.sum = sum
	m.gen = 1
	if cur != nil {
		m.gen = cur.gen + 1
	}
	r.cur.Store(m)
	return sum, true, nil
}

// load checks and builds one set of material.
func (r *Reloader) load(caPEM, certPEM, keyPEM []byte) (*material, error) {
	cas, err := parseCerts(caPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca %s: %w", r.cfg.CAFile, err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", r.cfg.CertFile, r.cfg.KeyFile, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: %w", r.cfg.CertFile, err)
		}
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s: intermediate: %w", r.cfg.CertFile, err)
		}
		inter.AddCert(c)
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("--tls-cert %s: not usable with the CAs of --tls-ca %s: %w", r.cfg.CertFile, r.cfg.CAFile, err)
	}
	id, err := IdentityOf(pair.Leaf)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s: %w", r.cfg.CertFile, err)
	}
	if r.cfg.Role != "" && id.Role != r.cfg.Role {
		return nil, fmt.Errorf("--tls-cert %s: is a%s %s certificate (%s); this process needs a%s %s certificate (apiary tls cert create --role %s)",
			r.cfg.CertFile, article(id.Role), id.Role, id, article(r.cfg.Role), r.cfg.Role, r.cfg.Role)
	}
	if r.cfg.Region != "" && id.Region != r.cfg.Region {
		return nil, fmt.Errorf("--tls-cert %s: is for region %q (%s); this process is in region %q",
			r.cfg.CertFile, id.Region, id, r.cfg.Region)
	}
	return &material{pool: pool, cert: &pair, id: id, caPEM: caPEM, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// ServerTLSConfig returns the configuration of a TLS server that requires
// and verifies a client certificate (RequireAndVerifyClientCert) against the
// current CA bundle and presents the current certificate, with TLS 1.3 at
// least. GetConfigForClient builds each handshake's configuration from the
// material in use, so reloads apply to new connections; it copies
// NextProtos from the returned config as it is at handshake time (grpc's
// credentials add "h2" themselves). Session tickets are disabled, so that no
// connection resumes on a client certificate the current bundle would not
// verify. The verified chain is in the connection state (PeerIdentity reads
// it).
func (r *Reloader) ServerTLSConfig() *tls.Config {
	base := &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ClientAuth:             tls.RequireAndVerifyClientCert,
		SessionTicketsDisabled: true,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.cur.Load().cert, nil
		},
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m := r.cur.Load()
		return &tls.Config{
			MinVersion:             tls.VersionTLS13,
			ClientAuth:             tls.RequireAndVerifyClientCert,
			ClientCAs:              m.pool,
			Certificates:           []tls.Certificate{*m.cert},
			SessionTicketsDisabled: true,
			NextProtos:             append([]string(nil), base.NextProtos...),
		}, nil
	}
	return base
}

// ClientTLSConfig returns the configuration of a TLS client that presents
// the current certificate (GetClientCertificate) and verifies the server
// against the current CA bundle, with TLS 1.3 at least.
//
// Go's client has no per-handshake RootCAs, so the standard verification is
// turned off (InsecureSkipVerify) and VerifyConnection does all of it
// itself, at every handshake, with the bundle in use: the chain must verify
// to the bundle, be valid now, allow ServerAuth, and match serverName. An
// empty serverName falls back to the SNI the connection sent, which TLS
// never sends for an IP address, so such a handshake fails; DialOption and
// TransportCredentials with an empty name use the dial target's host. When the name is an Apiary name
// <role>.<region>.apiary or <id>.<role>.<region>.apiary, the server's
// identity URI must say the same role and region (and id), so a certificate
// with a borrowed DNS name does not pass. InsecureSkipVerify is never set
// without this check. Use RegionServerName(region) to dial a region's
// coordinators and RouterServerName to dial a router.
func (r *Reloader) ClientTLSConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		// InsecureSkipVerify only skips the standard verification, which
		// would use a RootCAs fixed at construction; VerifyConnection below
		// verifies chain, validity, usage and name against the current
		// bundle at every handshake and fails it otherwise.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.cur.Load().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return r.verifyServer(cs, serverName)
		},
	}
}

// verifyServer is ClientTLSConfig's verification.
func (r *Reloader) verifyServer(cs tls.ConnectionState, name string) error {
	if name == "" {
		name = cs.ServerName
	}
	if name == "" {
		return errors.New("pki: no server name to verify the server's certificate against")
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("pki: the server sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: r.cur.Load().pool, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("pki: server certificate: %w", err)
	}
	want, ok := identityOfName(name)
	if !ok {
		return nil
	}
	got, err := IdentityOf(leaf)
	if err != nil {
		return fmt.Errorf("pki: server certificate: %w", err)
	}
	if got.Role != want.Role || got.Region != want.Region || (want.ID != "" && got.ID != want.ID) {
		return fmt.Errorf("pki: server %s presented %s: not the %s of region %s it was dialed as", name, got, want.Role, want.Region)
	}
	return nil
}
