package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"apiary.dev/apiary/internal/pki"
)

// EtcdConfig configures the coordinator's etcd: an embedded member (the
// default; the region's consensus tier is 1, 3 or 5 such coordinators) or,
// with Endpoints, a client of the members of other coordinators only
// (etcdclient.go; the scheduling tier may hold any number of these).
type EtcdConfig struct {
	// Endpoints, when set, makes the coordinator client-only
	// (`apiary region --etcd-endpoints`): it embeds no member and talks to
	// the region's etcd through these client URLs (the members'
	// --etcd-client-url, e.g. http://127.0.0.1:2379), https:// with the
	// coordinator's TLS (Config.TLS), http:// without. List every member,
	// so that the client fails over when one dies; the list is not synced
	// from the cluster. ClientURL, PeerURL and InitialCluster must then be
	// empty and ClusterState "" or "new" (Config.validate refuses them,
	// naming their flags); the member settings (Name, ElectionMs,
	// HeartbeatMs, QuotaBytes, CompactionRetention, the TLS files) are not
	// used.
	Endpoints []string
	// Name is the member name (defaults to the coordinator id).
	Name string
	// DataDir holds the member's WAL and snapshots, and the coordinator's
	// own files (the gossip keyrings: Config.GossipKeyringFile; with TLS,
	// the copies etcd reads, EtcdTLSDir). It must be set with Endpoints
	// too: a client-only coordinator keeps its gossip keyrings there (made
	// with mode 0700 if missing), and refuses a directory that holds an
	// etcd member's data (a member/ subdirectory), which would mean a
	// member of the cluster that no longer runs.
	DataDir string
	// ClientURL and PeerURL are listened on and advertised, e.g.
	// http://127.0.0.1:2379 and http://127.0.0.1:2380.
	ClientURL string
	PeerURL   string
	// ListenClientURL and ListenPeerURL, when set, are listened on instead
	// (etcd's --listen-client-urls and --listen-peer-urls), and ClientURL
	// and PeerURL are only advertised: a member that others reach by a
	// stable name (a StatefulSet pod's DNS name) while it binds 0.0.0.0,
	// since etcd binds only to IP addresses.
	ListenClientURL string
	ListenPeerURL   string
	// InitialCluster is "name=peerURL,..."; empty means a one-member cluster.
	InitialCluster string
	// ClusterState is "new" (default) or "existing".
	ClusterState string
	// ElectionMs and HeartbeatMs are raft timings (default 500 and 50: see
	// MEASURED.md; leader crash to next write is about 0.7 s).
	ElectionMs  uint
	HeartbeatMs uint
	// SnapshotCount is how many applied raft entries trigger a snapshot
	// (default 10,000, etcd's --snapshot-count), and SnapshotCatchUpEntries
	// how many entries the member keeps after a snapshot for a slow
	// follower (default 5,000, etcd's --snapshot-catchup-entries; a
	// follower further behind is sent the whole database). A member keeps
	// its raft log in memory between the two, and Apiary's entries are
	// whole plan and report batches: at several thousand tasks a second
	// that log was 36-39% of a 1-member coordinator's heap (issue 16's
	// profiles). Fewer entries trade memory for more frequent snapshots
	// and sooner full-database catch-ups.
	SnapshotCount, SnapshotCatchUpEntries uint64
	// QuotaBytes is the backend quota in bytes (default DefaultQuotaBytes,
	// 4 GiB; etcd's --quota-backend-bytes): past it the member raises a
	// NOSPACE alarm and refuses every write ("etcdserver: mvcc: database
	// space exceeded") until the state shrinks (compaction, then
	// defragmentation) and the alarm is disarmed. Free pages count: the
	// file's size is what is compared.
	QuotaBytes int64
	// CompactionRetention keeps this much history (default "1h";
	// etcd's --auto-compaction-mode periodic with
	// --auto-compaction-retention): older revisions are compacted away,
	// their pages freed inside the backend file (see DefragInterval).
	CompactionRetention string
	// DefragInterval is the least time between two defragmentations of
	// this member (defrag.go; default DefaultDefragInterval, 1 h;
	// negative: never). A defragmentation runs only when the free pages
	// are at least DefragMinFreeFraction of the file (default 0.25) and
	// DefragMinFreeBytes (default 64 MiB), and never while another member
	// defragments or does not answer.
	DefragInterval        time.Duration
	DefragMinFreeFraction float64
	DefragMinFreeBytes    int64
	// TLS, when its files are set, serves the client and peer URLs (then
	// https) with mutual TLS; the coordinator sets it with its own TLS
	// (Config.TLS, Config.validate), plaintext URLs (http) otherwise.
	TLS EtcdTLS
}

// EtcdTLS is the embedded member's mutual TLS, on both its client and its
// peer URLs (etcd's --cert-file/--peer-cert-file, ... with
// --client-cert-auth and --peer-client-cert-auth).
type EtcdTLS struct {
	// CAFile, CertFile and KeyFile are the coordinator's --tls-ca,
	// --tls-cert and --tls-key: the member serves and dials its peers with
	// the region certificate and accepts clients and peers whose
	// certificates the CA signed.
	//
	// A Coordinator does not give etcd these paths: etcd reads its files
	// itself (the certificate and key at every handshake, the CA bundle at
	// start only), so it would serve whatever the files hold, also what
	// the coordinator's pki.Reloader (Config.TLS) refuses (another
	// region's certificate, an expired one, one of another CA). The member
	// reads copies of what the Reloader accepted instead, in
	// <DataDir>/tls-etcd (EtcdTLSDir: mode 0700, files ca.pem, cert.pem
	// and key.pem, mode 0600), written before etcd starts and rewritten
	// (each file by a rename) within EtcdTLSPoll of each reload, so a
	// rotated certificate applies to etcd's new connections; the CA bundle
	// still applies to etcd at its next start only.
	CAFile, CertFile, KeyFile string
	// AllowedHostname is a DNS name a client's or peer's certificate must
	// carry (etcd's AllowedHostnames): region.<region>.apiary, so that only
	// the region's coordinators reach its etcd, not its agents, routers,
	// clients or another region's coordinators. Config.validate sets it.
	AllowedHostname string
}

// enabled reports whether TLS files are set.
func (t EtcdTLS) enabled() bool { return t.CertFile != "" }

// info is etcd's TLSInfo of t, for both client and peer URLs.
func (t EtcdTLS) info() transport.TLSInfo {
	info := transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile, ClientCertAuth: true,
		MinVersion: tls.VersionTLS12}
	if t.AllowedHostname != "" {
		info.AllowedHostnames = []string{t.AllowedHostname}
	}
	return info
}

// EtcdTLSDir is the directory under EtcdConfig.DataDir that holds the
// copies of the accepted TLS material the embedded member reads (EtcdTLS).
const EtcdTLSDir = "tls-etcd"

// EtcdTLSPoll is how often a coordinator with TLS compares its Reloader's
// Generation with the copies in EtcdTLSDir.
const EtcdTLSPoll = 200 * time.Millisecond

// etcdTLSCopy keeps the files in dir equal to the material a Reloader
// accepted. Used by the etcd part only (not safe for concurrent use).
type etcdTLSCopy struct {
	dir       string
	gen       uint64 // generation in the files; 0: none written
	failedGen uint64 // generation whose write failed and was logged
}

// files is t with the paths of the copies.
func (cp *etcdTLSCopy) files(t EtcdTLS) EtcdTLS {
	t.CAFile = filepath.Join(cp.dir, "ca.pem")
	t.CertFile = filepath.Join(cp.dir, "cert.pem")
	t.KeyFile = filepath.Join(cp.dir, "key.pem")
	return t
}

// write writes r's accepted material when its generation differs from the
// one in the files. The directory is made (or set to) mode 0700; each file
// is written to a temporary file (mode 0600) and renamed over the old one,
// the key and certificate renamed one right after the other, so etcd reads
// either file whole, never a mix of accepted and refused bytes. The error
// names the path; the old copies then stay.
func (cp *etcdTLSCopy) write(r *pki.Reloader) error {
	gen := r.Generation() // before PEM: a reload in between is seen next time
	if gen == cp.gen {
		return nil
	}
	ca, cert, key := r.PEM()
	if err := os.MkdirAll(cp.dir, 0o700); err != nil {
		return fmt.Errorf("etcd TLS copies: %w", err)
	}
	if err := os.Chmod(cp.dir, 0o700); err != nil {
		return fmt.Errorf("etcd TLS copies: %w", err)
	}
	f := cp.files(EtcdTLS{})
	items := []struct {
		path string
		b    []byte
	}{{f.CAFile, ca}, {f.KeyFile, key}, {f.CertFile, cert}}
	for _, it := range items {
		if err := writeTemp(it.path+".tmp", it.b); err != nil {
			return fmt.Errorf("etcd TLS copies: %w", err)
		}
	}
	for _, it := range items {
		if err := os.Rename(it.path+".tmp", it.path); err != nil {
			return fmt.Errorf("etcd TLS copies: %w", err)
		}
	}
	cp.gen = gen
	return nil
}

// follow is write after a reload, logged: INFO when new copies are in
// place, WARN once per generation that cannot be written (etcd keeps
// serving the previous accepted copies; the write is retried at each call).
func (cp *etcdTLSCopy) follow(r *pki.Reloader, log *slog.Logger) {
	gen := r.Generation()
	if gen == cp.gen {
		return
	}
	if err := cp.write(r); err != nil {
		if gen == cp.failedGen {
			return
		}
		cp.failedGen = gen
		log.Warn("cannot update etcd's copy of the reloaded TLS certificate; etcd keeps serving the previous one", "err", err, "generation", gen)
		return
	}
	log.Info("etcd serves the reloaded TLS certificate", "dir", cp.dir, "generation", cp.gen)
}

// writeTemp writes b to a new file at path, mode 0600, synced.
func writeTemp(path string, b []byte) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ClientOnly reports whether the coordinator embeds no member (Endpoints
// set).
func (c EtcdConfig) ClientOnly() bool { return len(c.Endpoints) > 0 }

// CheckEtcdURL refuses an etcd URL (of flag) that is not
// scheme://host:port: the scheme http or https, a host, a numeric port
// 1..65535 and nothing more (no path, query, fragment or user), which
// etcd would otherwise refuse only when the member starts. bind: the URL is
// listened on, and etcd binds an IP address (or localhost), never another
// host name. Whether the scheme matches TLS is checkSchemes' (Config
// validation).
func CheckEtcdURL(flag, raw string, bind bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %q must be an http:// or https:// URL, scheme://host:port (%v)", flag, raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s: %q must be an http:// or https:// URL (scheme://host:port)", flag, raw)
	}
	if u.Hostname() == "" || u.Opaque != "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s: %q must be scheme://host:port, with nothing after the port", flag, raw)
	}
	port := u.Port()
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		if port == "" {
			return fmt.Errorf("%s: %q has no port: etcd needs scheme://host:port (client URLs usually :2379, peer URLs :2380)", flag, raw)
		}
		return fmt.Errorf("%s: port of %q must be a number 1..65535, got %q", flag, raw, port)
	}
	if bind && u.Hostname() != "localhost" && net.ParseIP(u.Hostname()) == nil {
		return fmt.Errorf("%s: %q must name an IP address to bind (etcd binds no host name), e.g. %s://0.0.0.0:%s", flag, raw, u.Scheme, port)
	}
	return nil
}

// CheckURLs checks every etcd URL of c with CheckEtcdURL, naming its flag:
// with Endpoints, each endpoint; else the member's client and peer URLs
// (bound too unless ListenClientURL or ListenPeerURL are set, which are
// then bound), and each URL of InitialCluster (name=peerURL,...).
func (c EtcdConfig) CheckURLs() error {
	if c.ClientOnly() {
		for _, ep := range c.Endpoints {
			if strings.TrimSpace(ep) == "" {
				continue // checkClientOnly names it
			}
			if err := CheckEtcdURL("--etcd-endpoints", ep, false); err != nil {
				return err
			}
		}
		return nil
	}
	for _, u := range []struct {
		flag, url string
		bind      bool
	}{
		{"--etcd-client-url", c.ClientURL, c.ListenClientURL == ""},
		{"--etcd-peer-url", c.PeerURL, c.ListenPeerURL == ""},
		{"--etcd-listen-client-url", c.ListenClientURL, true},
		{"--etcd-listen-peer-url", c.ListenPeerURL, true},
	} {
		if u.url == "" {
			continue
		}
		if err := CheckEtcdURL(u.flag, u.url, u.bind); err != nil {
			return err
		}
	}
	if c.InitialCluster == "" {
		return nil
	}
	for _, m := range strings.Split(c.InitialCluster, ",") {
		name, u, ok := strings.Cut(m, "=")
		if !ok || name == "" {
			return fmt.Errorf("--initial-cluster: %q must be name=peerURL", m)
		}
		if err := CheckEtcdURL("--initial-cluster", u, false); err != nil {
			return fmt.Errorf("%w (member %s)", err, name)
		}
	}
	return nil
}

// checkSchemes refuses an etcd URL (client, peer, or one of the initial
// cluster; with Endpoints, each endpoint) whose scheme is not scheme
// (https with TLS, http without), naming the flag. With Endpoints it also
// refuses the member's settings (checkClientOnly).
func (c EtcdConfig) checkSchemes(scheme string) error {
	why := map[string]string{"https": "with TLS (--tls-*) etcd serves mutual TLS", "http": "without TLS (--insecure-dev) etcd serves plaintext"}[scheme]
	check := func(flag, raw string) error {
		u, err := url.Parse(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
		if u.Scheme != scheme {
			return fmt.Errorf("%s: %q must be a %s:// URL: %s", flag, raw, scheme, why)
		}
		return nil
	}
	if c.ClientOnly() {
		if err := c.checkClientOnly(); err != nil {
			return err
		}
		if err := c.CheckURLs(); err != nil {
			return err
		}
		for _, ep := range c.Endpoints {
			if err := check("--etcd-endpoints", ep); err != nil {
				return err
			}
		}
		return nil
	}
	if err := c.CheckURLs(); err != nil {
		return err
	}
	if err := check("--etcd-client-url", c.ClientURL); err != nil {
		return err
	}
	if err := check("--etcd-peer-url", c.PeerURL); err != nil {
		return err
	}
	for _, l := range []struct{ flag, url string }{{"--etcd-listen-client-url", c.ListenClientURL}, {"--etcd-listen-peer-url", c.ListenPeerURL}} {
		if l.url == "" {
			continue
		}
		if err := check(l.flag, l.url); err != nil {
			return err
		}
	}
	if c.InitialCluster == "" {
		return nil
	}
	for _, m := range strings.Split(c.InitialCluster, ",") {
		_, u, ok := strings.Cut(m, "=")
		if !ok {
			return fmt.Errorf("--initial-cluster: %q must be name=peerURL", m)
		}
		if err := check("--initial-cluster", u); err != nil {
			return err
		}
	}
	return nil
}

// etcdMaxRequestBytes is the largest request the embedded members accept
// (plans, submissions and report batches are multi-key Txns); a
// client-only coordinator's client may send as much (etcdClientConfig).
const etcdMaxRequestBytes = 16 << 20

// startEtcd starts the embedded member and waits until it serves (or ctx
// ends). The caller closes it with e.Close() exactly once.
func startEtcd(ctx context.Context, c EtcdConfig, log *slog.Logger) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.DataDir
	cu, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd-client-url: %w", err)
	}
	pu, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd-peer-url: %w", err)
	}
	// MEASURED.md trap 2: set all four URL lists, the cluster and its token.
	// The listen URLs default to the advertised ones.
	listen := func(flag, raw string, advertised *url.URL) (url.URL, error) {
		if raw == "" {
			return *advertised, nil
		}
		u, err := url.Parse(raw)
		if err != nil {
			return url.URL{}, fmt.Errorf("%s: %w", flag, err)
		}
		return *u, nil
	}
	lcu, err := listen("etcd-listen-client-url", c.ListenClientURL, cu)
	if err != nil {
		return nil, err
	}
	lpu, err := listen("etcd-listen-peer-url", c.ListenPeerURL, pu)
	if err != nil {
		return nil, err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{lcu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{lpu}, []url.URL{*pu}
	if c.TLS.enabled() {
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = c.TLS.info(), c.TLS.info()
	}
	cfg.InitialCluster = c.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + c.PeerURL
	}
	cfg.InitialClusterToken = EtcdClusterToken(cfg.InitialCluster)
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.ClusterState == "existing" {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.ElectionMs, cfg.TickMs = orDefault(c.ElectionMs, 500), orDefault(c.HeartbeatMs, 50)
	if c.SnapshotCount > 0 {
		cfg.SnapshotCount = c.SnapshotCount
	}
	if c.SnapshotCatchUpEntries > 0 {
		cfg.SnapshotCatchUpEntries = c.SnapshotCatchUpEntries
	}
	// MEASURED.md trap 1: the zero value logs every request as slow.
	cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	cfg.QuotaBackendBytes = c.QuotaBytes
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = DefaultQuotaBytes
	}
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = c.CompactionRetention
	if cfg.AutoCompactionRetention == "" {
		cfg.AutoCompactionRetention = "1h"
	}
	// Plans, submissions and report batches are multi-key Txns.
	cfg.MaxTxnOps = 32768
	cfg.MaxRequestBytes = etcdMaxRequestBytes
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdZap(log))
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		// A taken port is the usual cause: say which flag names it.
		return nil, fmt.Errorf("start etcd member %s (--etcd-client-url %s, --etcd-peer-url %s): %w", c.Name, c.ClientURL, c.PeerURL, err)
	}
	var clientTLS *tls.Config
	if c.TLS.enabled() {
		info := c.TLS.info()
		if clientTLS, err = info.ClientConfig(); err != nil {
			clientTLS = nil
		}
	}
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	go reportEtcdWait(waitCtx, e.Server.ReadyNotify(), c.Name, cfg.InitialCluster, clientTLS, c.TLS.AllowedHostname, log)
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd member %s: %w", c.Name, err)
	case <-ctx.Done():
		// Without a quorum a graceful Close can wait forever: stop hard,
		// and do not wait for the rest (the process is giving up anyway).
		e.Server.HardStop()
		go e.Close()
		return nil, fmt.Errorf("etcd member %s not ready (does a quorum of --initial-cluster run?): %w", c.Name, ctx.Err())
	}
}

// tokenOf is a short FNV-1a hash of the initial cluster string (the
// cluster token's suffix, EtcdClusterToken).
func tokenOf(cluster string) string {
	h := uint32(2166136261)
	for i := 0; i < len(cluster); i++ {
		h = (h ^ uint32(cluster[i])) * 16777619
	}
	return fmt.Sprintf("%08x", h)
}

func orDefault(v, d uint) uint {
	if v == 0 {
		return d
	}
	return v
}

// etcdZap is the embedded member's logger: quiet below DPanic (etcd logs
// errors on every normal shutdown, such as "use of closed network
// connection", which read like failures), and a fatal error (etcd calls zap's Fatal, which exits the process:
// for example when its data directory vanishes or a WAL write fails) is
// first logged through log as the etcd part failing, with etcd's message
// and fields, and the process then exits with 3 like any failed part
// (internal/lifecycle). A zap.NewNop logger would still exit, with code 1
// and not a word.
func etcdZap(log *slog.Logger) *zap.Logger {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(os.Stderr), zap.DPanicLevel)
	return zap.New(core, zap.WithFatalHook(etcdFatal{log}))
}

// etcdFatal is the zap hook run after a fatal entry is written.
type etcdFatal struct{ log *slog.Logger }

func (h etcdFatal) OnWrite(ce *zapcore.CheckedEntry, fields []zapcore.Field) {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	if h.log != nil {
		h.log.Error("part failed; stopping the process", "part", "etcd", "err", fmt.Sprintf("etcd fatal: %s %v", ce.Message, enc.Fields))
	}
	os.Exit(3)
}
