package main

// `apiary region snapshot save FILE` (AdminService.SaveSnapshot on a
// region's coordinator: etcd's snapshot of its member) and `apiary region
// snapshot restore FILE` (offline: etcd's own restore into a member data
// dir, regional.RestoreSnapshot), and the state size shown by `region
// status` and `region list` (GetRegionInfo's state_* fields).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/regional"
)

func newRegionSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save a region's whole state (etcd's snapshot) to a file, or restore a member's data dir from one",
		Long: `A region's state is its etcd: 'snapshot save' writes etcd's snapshot of it
(every job, task, node, ACL token hash and sealed secret, at one revision)
to a file; 'snapshot restore' makes an etcd member's data dir from such a
file, offline, for 'apiary region --data-dir' to start from. README.md,
"Region operations", walks through both for a 1- and a 3-member region.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newRegionSnapshotSaveCmd(), newRegionSnapshotRestoreCmd())
	return cmd
}

// snapshotSaved is `snapshot save -o json`'s answer.
type snapshotSaved struct {
	File     string `json:"file"`
	Region   string `json:"region"`
	Bytes    int64  `json:"bytes"`
	Revision int64  `json:"revision"`
	SHA256   string `json:"sha256"`
}

func newRegionSnapshotSaveCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "save FILE",
		Short: "Save a snapshot of the region's etcd state to FILE (ask one of its coordinators)",
		Long: `Save etcd's snapshot of the region whose coordinator --addr names: the
answering coordinator's etcd member (a coordinator without a member: the
first member that answers) sends its whole backend at one revision, with
its sha256 appended (etcd's snapshot format, what 'etcdutl snapshot
restore' takes). The file is written to a temporary file next to FILE,
synced, its sha256 checked, then renamed over FILE (mode 0600: it holds
every job's spec and environment and the ACL tokens' hashes; secrets stay
sealed with the region's key). A file that fails the check is removed and
the command exits 3.

It prints the file's size, the etcd revision the snapshot was taken at and
its sha256. With ACLs it needs a management token. A global router does not
serve this (exit 2, naming the coordinators to ask). The snapshot is as
large as the state's backend in use (see 'apiary region status', "State"),
and a member serves it while it keeps serving everything else.`,
		Example: `  apiary region snapshot save eu-west-2025-03-01.db --addr 127.0.0.1:7071`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return saveSnapshot(cmd, o, args[0])
		},
	}
	o.addFlags(cmd)
	return cmd
}

// saveSnapshot asks GetRegionInfo first (with --timeout's retries, and the
// router check), then streams SaveSnapshot into a temporary file next to
// path, checks it and renames it over path.
func saveSnapshot(cmd *cobra.Command, o *clientOpts, path string) error {
	var code codes.Code
	info, err := unaryCall(cmd, o, func() error {
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			return withCode(exitInvalid, fmt.Errorf("FILE %s is a directory: give a file name", path))
		}
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			return withCode(exitInvalid, fmt.Errorf("FILE %s: %w", path, err))
		}
		return nil
	}, apiaryv1.NewAdminServiceClient, "",
		func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.GetRegionInfoResponse, error) {
			r, err := c.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
			code = status.Code(err)
			return r, err
		})
	if err != nil && code == codes.Unimplemented {
		return routerHint(cmd, o, "snapshot save "+path)
	}
	if err != nil {
		return err
	}
	cc, addr, err := o.conn(cmd)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, stop := signalContext(cmd)
	defer stop()
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return withCode(exitInvalid, fmt.Errorf("FILE %s: %w", path, err))
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	stream, err := apiaryv1.NewAdminServiceClient(cc).SaveSnapshot(ctx, &apiaryv1.SaveSnapshotRequest{})
	if err != nil {
		return rpcError(err, addr, "")
	}
	var n int64
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if status.Code(err) == codes.Unimplemented {
				return routerHint(cmd, o, "snapshot save "+path)
			}
			return rpcError(fmt.Errorf("after %d bytes of the snapshot: %w", n, err), addr, "")
		}
		if _, err := tmp.Write(m.GetData()); err != nil {
			return withCode(exitUnavailable, fmt.Errorf("write %s: %w", tmp.Name(), err))
		}
		n += int64(len(m.GetData()))
	}
	if err := tmp.Sync(); err != nil {
		return withCode(exitUnavailable, fmt.Errorf("sync %s: %w", tmp.Name(), err))
	}
	if err := tmp.Close(); err != nil {
		return withCode(exitUnavailable, fmt.Errorf("close %s: %w", tmp.Name(), err))
	}
	snap, err := regional.CheckSnapshot(tmp.Name())
	if err != nil {
		return withCode(exitUnavailable, fmt.Errorf("the snapshot received from %s fails its check, nothing written to %s: %w", addr, path, err))
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return withCode(exitUnavailable, fmt.Errorf("FILE %s: %w", path, err))
	}
	keep = true
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	out := snapshotSaved{File: path, Region: info.GetRegion(), Bytes: snap.Bytes, Revision: snap.Revision, SHA256: snap.SHA256}
	if o.output == "json" {
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintln(cmd.OutOrStdout(), string(b))
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Saved a snapshot of region %s to %s: %s (%d bytes), etcd revision %d, sha256 %s\n",
		out.Region, path, humanize.IBytes(uint64(out.Bytes)), out.Bytes, out.Revision, out.SHA256)
	return nil
}

func newRegionSnapshotRestoreCmd() *cobra.Command {
	var (
		cfg      regional.RestoreConfig
		peerURLs string
	)
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR --name ID",
		Short: "Make an etcd member's data dir from a snapshot file (offline), for 'apiary region --data-dir DIR' to start from",
		Long: `Restore a snapshot that 'apiary region snapshot save' wrote into DIR/member,
with etcd's own restore (the etcd version apiary embeds): it checks the
file's sha256, rewrites the cluster membership to --initial-cluster (or
this member alone), and writes the member's WAL and raft snapshot. Run it
with the coordinators of the region stopped; nothing is dialled.

--name is the member's name: the coordinator's --id. --etcd-peer-url and
--initial-cluster must be what the coordinator will be started with (the
peer URL defaults to --name's entry of --initial-cluster, else to
'apiary region's default http://127.0.0.1:2380; with TLS give the https://
URL). DIR may exist (e.g. with the gossip keyrings) but must hold no
member/ yet. Revisions continue --bump-revision above the snapshot's and
the older ones are marked compacted (etcdutl's --bump-revision and
--mark-compacted), so that every fencing token, node epoch and shard epoch
of the restored region is above any the old one handed out.

One member: restore, then start the coordinator with the same --id,
--data-dir, --etcd-peer-url, --region and --shards as before.

Three members: restore the same FILE once per member, each with its own
--name and --data-dir and the same full --initial-cluster, then start all
three coordinators with that --initial-cluster (README.md, "Region
operations").`,
		Example: `  apiary region snapshot restore eu-west.db --data-dir /var/lib/apiary/c1 --name c1 \
    --etcd-peer-url https://10.0.0.1:2380
  # a 3-member region: on each member's host, its own --name and --data-dir
  apiary region snapshot restore eu-west.db --data-dir /var/lib/apiary/c2 --name c2 \
    --initial-cluster c1=https://10.0.0.1:2380,c2=https://10.0.0.2:2380,c3=https://10.0.0.3:2380`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.SnapshotPath = args[0]
			if peerURLs != "" {
				if cfg.PeerURL != "" && cfg.PeerURL != peerURLs {
					return withCode(exitInvalid, fmt.Errorf("--initial-advertise-peer-urls %s: differs from --etcd-peer-url %s; give one", peerURLs, cfg.PeerURL))
				}
				cfg.PeerURL = peerURLs
			}
			if strings.Contains(cfg.PeerURL, ",") {
				return withCode(exitInvalid, fmt.Errorf("--etcd-peer-url %s: one URL (the coordinator's --etcd-peer-url)", cfg.PeerURL))
			}
			if cfg.PeerURL == "" && cfg.InitialCluster == "" {
				cfg.PeerURL = "http://127.0.0.1:2380"
			}
			snap, err := regional.CheckSnapshot(cfg.SnapshotPath)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if err := regional.RestoreSnapshot(cfg); err != nil {
				return withCode(exitInvalid, err)
			}
			cluster := cfg.InitialCluster
			start := fmt.Sprintf("apiary region --id %s --data-dir %s", cfg.Name, cfg.DataDir)
			if cfg.PeerURL != "" {
				start += " --etcd-peer-url " + cfg.PeerURL
			}
			if cluster != "" {
				start += " --initial-cluster " + cluster
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "Restored %s (etcd revision %d, %s) into %s as etcd member %s",
				cfg.SnapshotPath, snap.Revision, humanize.IBytes(uint64(snap.Bytes)), filepath.Join(cfg.DataDir, "member"), cfg.Name)
			if cfg.RevisionBump > 0 {
				fmt.Fprintf(w, "; its revisions continue above %d", snap.Revision+int64(cfg.RevisionBump))
			}
			fmt.Fprintf(w, ".\nStart it with the region's other flags as before (--region, --shards, TLS, ...):\n  %s\n", start)
			if cluster != "" && strings.Count(cluster, "=") > 1 {
				fmt.Fprintln(w, "Restore every other member of --initial-cluster from the same file (its own --name and --data-dir), then start them all.")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "", "the coordinator's --data-dir: the member is restored into DIR/member (required)")
	f.StringVar(&cfg.Name, "name", "", "the member's name: the coordinator's --id (required)")
	f.StringVar(&cfg.PeerURL, "etcd-peer-url", "", "the coordinator's --etcd-peer-url (default: --name's URL in --initial-cluster, else http://127.0.0.1:2380)")
	f.StringVar(&peerURLs, "initial-advertise-peer-urls", "", "etcdutl's name of --etcd-peer-url")
	_ = f.MarkHidden("initial-advertise-peer-urls")
	f.StringVar(&cfg.InitialCluster, "initial-cluster", "", "the region's --initial-cluster, name=peerURL,... of every member, the same for each (default: this member alone)")
	f.Uint64Var(&cfg.RevisionBump, "bump-revision", regional.DefaultRevisionBump, "add this to the snapshot's revision and mark the older ones compacted (0: keep the revisions; only for a snapshot taken at the moment the region stopped)")
	_ = cmd.MarkFlagRequired("data-dir")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// fmtState is the state size of GetRegionInfo, e.g. "12 MiB (9.1 MiB in
// use) of 4.0 GiB"; "unknown" when the coordinator did not say.
func fmtState(size, inUse, quota int64) string {
	if size <= 0 {
		return "unknown"
	}
	s := fmt.Sprintf("%s (%s in use)", humanize.IBytes(uint64(size)), humanize.IBytes(uint64(inUse)))
	if quota > 0 {
		s += fmt.Sprintf(" of %s (%.0f%% of the quota)", humanize.IBytes(uint64(quota)), 100*float64(size)/float64(quota))
	}
	return s
}

// fmtStateShort is fmtState as a table cell: "12MiB/4.0GiB" ("-" unknown).
func fmtStateShort(size, quota int64) string {
	if size <= 0 {
		return "-"
	}
	s := strings.ReplaceAll(humanize.IBytes(uint64(size)), " ", "")
	if quota > 0 {
		s += "/" + strings.ReplaceAll(humanize.IBytes(uint64(quota)), " ", "")
	}
	return s
}

// regionStateTimeout bounds region list's GetRegionInfo of each region.
const regionStateTimeout = 2 * time.Second

// fillRegionStates asks each region that is up for its state size
// (GetRegionInfo on its alive coordinators, verifying
// region.<region>.apiary, within regionStateTimeout) and sets the
// summary's state_size_bytes, state_in_use_bytes and state_quota_bytes
// (left 0 when none answered).
func fillRegionStates(ctx context.Context, o *clientOpts, regions []*apiaryv1.RegionSummary) {
	var wg sync.WaitGroup
	for _, r := range regions {
		var addrs []string
		for _, c := range r.GetCoordinators() {
			if c.GetMemberStatus() == "alive" && c.GetApiAddr() != "" {
				addrs = append(addrs, c.GetApiAddr())
			}
		}
		if !r.GetUp() || len(addrs) == 0 {
			continue
		}
		wg.Go(func() {
			cc, err := o.dial(strings.Join(addrs, ","), pki.RegionServerName(r.GetName()))
			if err != nil {
				return
			}
			defer cc.Close()
			cctx, cancel := context.WithTimeout(ctx, regionStateTimeout)
			defer cancel()
			info, err := apiaryv1.NewAdminServiceClient(cc).GetRegionInfo(cctx, &apiaryv1.GetRegionInfoRequest{})
			if err != nil {
				return
			}
			// Each goroutine writes its own summary only.
			r.StateSizeBytes, r.StateInUseBytes, r.StateQuotaBytes = info.GetStateSizeBytes(), info.GetStateInUseBytes(), info.GetStateQuotaBytes()
		})
	}
	wg.Wait()
}
