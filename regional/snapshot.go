package regional

// Snapshots of the region's etcd state and its size (issue 16, "operations
// at size"): AdminService.SaveSnapshot streams etcd's own snapshot
// (Maintenance.Snapshot: the whole bbolt backend at one revision, with its
// sha256 appended) from the answering coordinator's member, and
// GetRegionInfo reports the backend's size, the part of it in use and the
// quota. The offline half, used by `apiary region snapshot save` and
// `restore`, is here too: CheckSnapshot verifies a saved file (etcd's
// format: the last 32 bytes are the sha256 of the rest) and RestoreSnapshot
// makes a member data dir from it with etcd's own restore
// (go.etcd.io/etcd/etcdutl/v3/snapshot, the etcd version of go.mod), laid
// out where `apiary region --data-dir DIR` looks for its member: DIR/member
// (embed.Config.Dir = DIR; etcd keeps DIR/member/wal and DIR/member/snap).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// SnapshotChunkBytes is the size of one SaveSnapshotResponse (1 MiB; the
// last one is shorter).
const SnapshotChunkBytes = 1 << 20

// DefaultQuotaBytes is EtcdConfig.QuotaBytes' default: 4 GiB (etcd's
// --quota-backend-bytes; etcd's own default is 2 GiB, its suggested
// maximum 8 GiB).
const DefaultQuotaBytes int64 = 4 << 30

// snapshotStatusTimeout bounds the Status call that picks the member a
// client-only coordinator snapshots, and each state-size read.
const snapshotStatusTimeout = 2 * time.Second

// snapshotClient is a new gRPC client whose Snapshot reaches one member:
// the coordinator's own member through its client URL (not the in-process
// client c.cli, whose streams end in "context canceled" rather than EOF:
// etcd's grpcproxy adapter), or, for a client-only coordinator, the first
// of its endpoints that answers Status. done closes it; member names the
// member ("c1" or the endpoint URL).
func (c *Coordinator) snapshotClient(ctx context.Context) (cli *clientv3.Client, member string, done func(), err error) {
	if !c.cfg.Etcd.ClientOnly() {
		cfg := c.etcdClientConfig()
		cfg.Endpoints = []string{c.cfg.Etcd.ClientURL}
		cfg.TLS = c.etcdClientTLS()
		own, err := clientv3.New(cfg)
		if err != nil {
			return nil, "", nil, fmt.Errorf("etcd member %s at %s: %w", c.cfg.Etcd.Name, c.cfg.Etcd.ClientURL, err)
		}
		return own, c.cfg.Etcd.Name, func() { _ = own.Close() }, nil
	}
	var why []string
	for _, ep := range c.cfg.Etcd.Endpoints {
		sctx, cancel := context.WithTimeout(ctx, snapshotStatusTimeout)
		_, err := c.cli.Status(sctx, ep)
		cancel()
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", ep, err))
			continue
		}
		cfg := c.etcdClientConfig()
		cfg.Endpoints = []string{ep}
		one, err := clientv3.New(cfg)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", ep, err))
			continue
		}
		return one, ep, func() { _ = one.Close() }, nil
	}
	return nil, "", nil, fmt.Errorf("no etcd endpoint answers (%s)", strings.Join(why, "; "))
}

// quotaBytes is the backend quota of the coordinator's own member (0 for a
// client-only coordinator: the members' quota is theirs and etcd's Status
// does not report it).
func (c *Coordinator) quotaBytes() int64 {
	if c.cfg.Etcd.ClientOnly() {
		return 0
	}
	if q := c.cfg.Etcd.QuotaBytes; q > 0 {
		return q
	}
	return DefaultQuotaBytes
}

// stateSize fills out's state_* fields from a member's Status (the
// backend file's size and the part in use: the coordinator's own member,
// or, client-only, the first endpoint that answers) and the quota; on an
// error it leaves them 0 (unknown), as GetRegionInfo answers without them.
func (c *Coordinator) stateSize(ctx context.Context, out *apiaryv1.GetRegionInfoResponse) {
	sctx, cancel := context.WithTimeout(ctx, snapshotStatusTimeout)
	defer cancel()
	eps := []string{""} // the in-process client ignores the endpoint
	if c.cfg.Etcd.ClientOnly() {
		eps = c.cfg.Etcd.Endpoints
	}
	for _, ep := range eps {
		if st, err := c.cli.Status(sctx, ep); err == nil {
			out.StateSizeBytes, out.StateInUseBytes, out.StateQuotaBytes = st.DbSize, st.DbSizeInUse, c.quotaBytes()
			return
		}
	}
}

// SaveSnapshot streams etcd's snapshot of the member snapshotClient picks, in
// SnapshotChunkBytes pieces, for as long as the caller's stream lasts (no
// deadline: a 4 GiB backend takes a while). The management-token check is
// the ACL interceptor's (aclMethods). Errors: UNAVAILABLE when no member
// answers or the snapshot stream breaks (the caller then has a partial
// file, which fails its sha256 check).
func (s *adminServer) SaveSnapshot(_ *apiaryv1.SaveSnapshotRequest, stream grpc.ServerStreamingServer[apiaryv1.SaveSnapshotResponse]) error {
	c := s.c
	ctx := stream.Context()
	cli, member, done, err := c.snapshotClient(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "save snapshot: %v", err)
	}
	defer done()
	start := time.Now()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "save snapshot of etcd member %s: %v", member, err)
	}
	defer rc.Close()
	buf := make([]byte, SnapshotChunkBytes)
	var total int64
	for {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 {
			if err := stream.Send(&apiaryv1.SaveSnapshotResponse{Data: buf[:n]}); err != nil {
				return err
			}
			total += int64(n)
		}
		if rerr == io.EOF || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return status.Errorf(codes.Unavailable, "save snapshot of etcd member %s: after %d bytes: %v", member, total, rerr)
		}
	}
	who := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		who = p.Addr.String()
	}
	c.log.Info("etcd snapshot sent", "member", member, "bytes", total, "took", time.Since(start).Round(time.Millisecond).String(), "peer", who)
	return nil
}

// SnapshotInfo describes a snapshot file CheckSnapshot verified.
type SnapshotInfo struct {
	// Bytes is the file's size, the sha256 included.
	Bytes int64
	// Revision is the etcd revision the snapshot was taken at (the newest
	// revision in its key bucket).
	Revision int64
	// SHA256 is the hex of the file's appended sha256 (of the rest).
	SHA256 string
}

// CheckSnapshot verifies an etcd snapshot file: it must end in the sha256
// of the bytes before it, and its size less those 32 bytes must be a
// whole number of 512-byte sectors (etcd's own test: etcdutl's
// hasChecksum); then it reads the snapshot's revision from its key bucket
// (one seek, not a scan). Errors name the path and what is wrong.
func CheckSnapshot(path string) (SnapshotInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return SnapshotInfo{}, err
	}
	n := fi.Size()
	if n < 512+sha256.Size || n%512 != sha256.Size {
		return SnapshotInfo{}, fmt.Errorf("%s: %d bytes is not an etcd snapshot with its sha256 appended (size must be 512*k + 32)", path, n)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, n-sha256.Size)); err != nil {
		return SnapshotInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return SnapshotInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return SnapshotInfo{}, fmt.Errorf("%s: sha256 mismatch: the file says %x, its content is %x (a truncated or corrupted snapshot)", path, want, got)
	}
	info := SnapshotInfo{Bytes: n, SHA256: fmt.Sprintf("%x", want)}
	rev, err := snapshotRevision(path)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	info.Revision = rev
	return info, nil
}

// snapshotRevision is the main revision of the last key of the backend's
// "key" bucket (etcd's mvcc revision keys: 8 bytes main, '_', 8 bytes sub,
// big endian), opened read-only.
func snapshotRevision(path string) (int64, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, fmt.Errorf("open as an etcd backend: %w", err)
	}
	defer db.Close()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("key"))
		if b == nil {
			return errors.New("no key bucket: not an etcd v3 backend")
		}
		k, _ := b.Cursor().Last()
		if len(k) >= 8 {
			rev = int64(binary.BigEndian.Uint64(k[:8]))
		}
		return nil
	})
	return rev, err
}

// RestoreConfig is what RestoreSnapshot needs: the member it makes and the
// cluster that member belongs to, exactly as `apiary region` will be
// started with them.
type RestoreConfig struct {
	// SnapshotPath is the file `apiary region snapshot save` wrote.
	SnapshotPath string
	// DataDir is the coordinator's --data-dir: the member is restored into
	// DataDir/member, which must not exist (DataDir may, e.g. with the
	// gossip keyrings in it).
	DataDir string
	// Name is the member's name: the coordinator's --id (EtcdConfig.Name).
	Name string
	// PeerURL is the member's --etcd-peer-url.
	PeerURL string
	// InitialCluster is the region's --initial-cluster (name=peerURL,...),
	// the same string for every member; "" for a one-member region
	// (Name=PeerURL, as `apiary region` makes it).
	InitialCluster string
	// RevisionBump is added to the snapshot's revision, and the old
	// revisions are marked compacted (etcdutl's --bump-revision with
	// --mark-compacted), so that every revision the restored region hands
	// out (fencing tokens, node epochs, shard epochs) is above any the old
	// one handed out after the snapshot; 0: no bump.
	RevisionBump uint64
	// Logger receives etcd's restore log (nil: none).
	Logger *zap.Logger
}

// DefaultRevisionBump is the revision bump of `apiary region snapshot
// restore` (etcd's documentation suggests 1,000,000,000: more revisions
// than a region writes between a snapshot and its restore).
const DefaultRevisionBump = 1_000_000_000

// EtcdClusterToken is the initial cluster token `apiary region` gives its
// embedded member for initialCluster (name=peerURL,...; for a one-member
// region, name=peerURL of its own). A restore must use the same one, as
// etcd derives the member and cluster ids from it.
func EtcdClusterToken(initialCluster string) string { return "apiary-" + tokenOf(initialCluster) }

// RestoreSnapshot makes cfg.DataDir/member from a snapshot file with etcd's
// restore (it checks the snapshot's sha256, rewrites its membership to
// cfg's cluster, and writes a WAL and a raft snapshot), so that `apiary
// region --id Name --data-dir DataDir --etcd-peer-url PeerURL
// [--initial-cluster InitialCluster]` starts from it. The member is built in
// a temporary directory under DataDir and renamed into place, so a failed
// restore leaves no member dir behind. Errors: Name or PeerURL missing, Name
// not in InitialCluster or with another peer URL there, DataDir/member
// present, a bad snapshot (etcd's message), each naming the flag or path.
func RestoreSnapshot(cfg RestoreConfig) error {
	if cfg.Name == "" {
		return errors.New("--name: the member's name (the coordinator's --id) is required")
	}
	if !nameRE.MatchString(cfg.Name) {
		return fmt.Errorf("--name: must match %s (a coordinator id), got %q", nameRE, cfg.Name)
	}
	if cfg.DataDir == "" {
		return errors.New("--data-dir: the coordinator's data dir is required")
	}
	cluster := cfg.InitialCluster
	if cluster == "" {
		if cfg.PeerURL == "" {
			return errors.New("--etcd-peer-url: required without --initial-cluster")
		}
		cluster = cfg.Name + "=" + cfg.PeerURL
	}
	urls, err := types.NewURLsMap(cluster)
	if err != nil {
		return fmt.Errorf("--initial-cluster: %q must be name=peerURL,...: %w", cluster, err)
	}
	own, ok := urls[cfg.Name]
	if !ok {
		return fmt.Errorf("--initial-cluster: %q has no member %q (--name)", cluster, cfg.Name)
	}
	if cfg.PeerURL == "" {
		cfg.PeerURL = own[0].String()
	} else if own.String() != cfg.PeerURL {
		return fmt.Errorf("--etcd-peer-url %s: --initial-cluster gives member %s the peer URL %s", cfg.PeerURL, cfg.Name, own.String())
	}
	member := filepath.Join(cfg.DataDir, "member")
	if _, err := os.Stat(member); err == nil {
		return fmt.Errorf("--data-dir %s holds an etcd member already (%s): restore into a fresh data dir, or move that one away first", cfg.DataDir, member)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--data-dir: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	tmp, err := os.MkdirTemp(cfg.DataDir, ".restore-")
	if err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	out := filepath.Join(tmp, "data")
	err = snapshot.NewV3(lg).Restore(snapshot.RestoreConfig{
		SnapshotPath:        cfg.SnapshotPath,
		Name:                cfg.Name,
		OutputDataDir:       out,
		PeerURLs:            []string{cfg.PeerURL},
		InitialCluster:      cluster,
		InitialClusterToken: EtcdClusterToken(cluster),
		RevisionBump:        cfg.RevisionBump,
		MarkCompacted:       cfg.RevisionBump > 0,
	})
	if err != nil {
		return fmt.Errorf("restore %s: %w", cfg.SnapshotPath, err)
	}
	if err := os.Rename(filepath.Join(out, "member"), member); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	return syncDir(cfg.DataDir)
}

// syncDir fsyncs a directory (after a rename into it).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
