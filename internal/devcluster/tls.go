package devcluster

// Mutual TLS of a dev cluster (Options.TLS): a CA and one certificate per
// process under <Dir>/tls, made with internal/pki as `apiary tls` makes them.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/pki"
)

// ClientID is the id of the client certificate a TLS cluster makes for
// its callers (Cluster.ClientTLS).
const ClientID = "devcluster"

// PKI is a CA and the certificates made with it, as files in one
// directory: apiary-ca.pem and apiary-ca-key.pem, and
// <region>-<role>-<id>.pem and <region>-<role>-<id>-key.pem per certificate
// (the names `apiary tls` uses). Safe for concurrent use.
type PKI struct {
	// Dir holds the files.
	Dir string

	mu           sync.Mutex
	caPEM, caKey []byte
}

// NewPKI makes dir (mode 0700) and a CA in it, or loads the CA already
// there (a cluster restarted on the same Dir keeps its certificates).
func NewPKI(dir string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir}
	ca, errCA := os.ReadFile(p.CAFile())
	key, errKey := os.ReadFile(filepath.Join(dir, "apiary-ca-key.pem"))
	switch {
	case errCA == nil && errKey == nil:
		p.caPEM, p.caKey = ca, key
		return p, nil
	case !errors.Is(errCA, fs.ErrNotExist):
		return nil, fmt.Errorf("devcluster: CA: %w", errCA)
	}
	ca, key, err := pki.CreateCA(pki.CAOptions{})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "apiary-ca-key.pem"), key, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.CAFile(), ca, 0o644); err != nil {
		return nil, err
	}
	p.caPEM, p.caKey = ca, key
	return p, nil
}

// CAFile is the CA certificate's path (every process's --tls-ca).
func (p *PKI) CAFile() string { return filepath.Join(p.Dir, "apiary-ca.pem") }

// Cert returns the files of the certificate of role, region and id (see
// pki.CertOptions), making it if it does not exist yet.
func (p *PKI) Cert(role, region, id string) (cliconn.TLSFiles, error) {
	opts := pki.CertOptions{Role: role, Region: region, ID: id}
	ident, err := opts.Identity()
	if err != nil {
		return cliconn.TLSFiles{}, fmt.Errorf("devcluster: certificate of %s %s/%s: %w", role, region, id, err)
	}
	name := fmt.Sprintf("%s-%s-%s", ident.Region, ident.Role, ident.ID)
	f := p.files(name)
	if _, err := os.Stat(f.Cert); err == nil {
		return f, nil
	}
	return p.Issue(opts, name)
}

// Issue makes a certificate with opts (any validity: tests make expired
// ones), written as <name>.pem and <name>-key.pem, replacing files of that
// name.
func (p *PKI) Issue(opts pki.CertOptions, name string) (cliconn.TLSFiles, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cert, key, err := pki.CreateCert(p.caPEM, p.caKey, opts)
	if err != nil {
		return cliconn.TLSFiles{}, fmt.Errorf("devcluster: certificate %s: %w", name, err)
	}
	f := p.files(name)
	if err := os.WriteFile(f.Key, key, 0o600); err != nil {
		return cliconn.TLSFiles{}, err
	}
	if err := os.WriteFile(f.Cert, cert, 0o644); err != nil {
		return cliconn.TLSFiles{}, err
	}
	return f, nil
}

func (p *PKI) files(name string) cliconn.TLSFiles {
	return cliconn.TLSFiles{CA: p.CAFile(), Cert: filepath.Join(p.Dir, name+".pem"), Key: filepath.Join(p.Dir, name+"-key.pem")}
}

// Args are the flags that give a process files f.
func Args(f cliconn.TLSFiles) []string {
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// Env are the environment entries that give the CLI files f
// (APIARY_CACERT, APIARY_CLIENT_CERT, APIARY_CLIENT_KEY).
func Env(f cliconn.TLSFiles) []string {
	return []string{cliconn.EnvCACert + "=" + f.CA, cliconn.EnvClientCert + "=" + f.Cert, cliconn.EnvClientKey + "=" + f.Key}
}

// TLSConfig is a client configuration presenting f's certificate and
// trusting f's CA, verifying the server's name as Go does (the host dialed,
// e.g. 127.0.0.1, which region certificates carry): for clients that are
// not gRPC, such as an etcd client (clientv3.Config.TLS).
func TLSConfig(f cliconn.TLSFiles) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s: no CA certificate", f.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// tlsArgs are the transport flags of a process with the certificate of
// role, region and id: the TLS files with a PKI, else --insecure-dev.
func tlsArgs(p *PKI, role, region, id string) ([]string, error) {
	if p == nil {
		return []string{"--insecure-dev"}, nil
	}
	f, err := p.Cert(role, region, id)
	if err != nil {
		return nil, err
	}
	return Args(f), nil
}

// setupTLS makes the cluster's CA and client certificate (Options.TLS).
func (c *Cluster) setupTLS() error {
	if !c.opts.TLS {
		return nil
	}
	p, err := NewPKI(filepath.Join(c.opts.Dir, "tls"))
	if err != nil {
		return err
	}
	f, err := p.Cert(pki.RoleClient, pki.GlobalRegion, ClientID)
	if err != nil {
		return err
	}
	r, err := f.Load()
	if err != nil {
		return err
	}
	c.pki, c.clientFiles, c.client = p, f, r
	return nil
}

// PKI is the cluster's CA and certificates (nil without Options.TLS).
func (c *Cluster) PKI() *PKI { return c.pki }

// TLS reports whether the cluster runs with mutual TLS (Options.TLS).
func (c *Cluster) TLS() bool { return c.pki != nil }

// ClientTLS returns the CA, certificate and key of the cluster's client
// certificate (role client, region global, id ClientID): what a CLI or API
// user passes as --tls-ca, --tls-cert and --tls-key. Zero without
// Options.TLS.
func (c *Cluster) ClientTLS() cliconn.TLSFiles { return c.clientFiles }

// ClientEnv are the environment entries that make the CLI use the
// client certificate (none without Options.TLS) and, with Options.ACL, the
// management token ($APIARY_TOKEN).
func (c *Cluster) ClientEnv() []string {
	if c.pki == nil {
		return nil
	}
	env := Env(c.clientFiles)
	if c.mgmt != "" {
		env = append(env, acl.EnvToken+"="+c.mgmt)
	}
	return env
}

// Dial returns a client connection to addr (a host:port or a list) as the
// cluster's client: with mutual TLS and the client certificate, verifying
// the address's host, or plaintext without Options.TLS; with Options.ACL
// every call carries the management token (once Start has made it).
func (c *Cluster) Dial(addr string) (*grpc.ClientConn, error) {
	return cliconn.DialTLS(addr, c.client, "", cliconn.WithToken(c.mgmt))
}

// EtcdClient is a client of region r's etcd (EtcdEndpoints), as r's first
// coordinator reaches it (EtcdTLS with Options.TLS); the caller closes it.
func (c *Cluster) EtcdClient(r *Region) (*clientv3.Client, error) {
	tc, err := c.EtcdTLS(r)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: r.EtcdEndpoints, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// EtcdTLS is a client configuration for the etcd of region r (its client
// URLs, EtcdEndpoints): the certificate of r's first coordinator, as only
// the region's coordinators may reach its etcd. Nil without Options.TLS.
func (c *Cluster) EtcdTLS(r *Region) (*tls.Config, error) {
	if c.pki == nil {
		return nil, nil
	}
	f, err := c.pki.Cert(pki.RoleRegion, r.Spec.Name, r.Coords[0].Name)
	if err != nil {
		return nil, err
	}
	return TLSConfig(f)
}
