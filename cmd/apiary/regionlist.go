package main

// The federation side of `apiary region`: the coordinator's WAN, policy and
// admission flags, `apiary region list` (AdminService.ListRegions, on the
// global router or a coordinator) and `apiary region status`
// (AdminService.GetRegionInfo on a region's coordinators); `apiary region
// shards` is in regionshards.go.

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/regional"
)

// regionFederationHook adds the federation flags to `apiary region` and the
// `list` subcommand. The flags are parsed in PreRunE, before the coordinator
// is created, so a bad policy file fails start-up with exit 2.
func regionFederationHook(cmd *cobra.Command, cfg *regional.Config) {
	var (
		wanJoin    []string
		policyPath string
		maxPending string
	)
	f := cmd.Flags()
	f.StringVar(&cfg.WAN.Bind, "wan-bind", "", "serf WAN pool listen host:port (empty: off, or 127.0.0.1:0 with --wan-join)")
	f.StringVar(&cfg.WAN.Advertise, "wan-advertise", "", "serf WAN address others reach this coordinator at (default --wan-bind)")
	f.StringSliceVar(&wanJoin, "wan-join", nil, "WAN pool members to join (the global router or other coordinators), host:port")
	f.StringVar(&policyPath, "policy", "", "sovereignty policy file, re-checked before a job is accepted (see deploy/policy.yaml)")
	f.StringVar(&maxPending, "max-pending", "", "backlog bound: refuse new jobs with RESOURCE_EXHAUSTED while this many tasks of their priority class are pending; N or batch=N,standard=N,urgent=N (empty or 0: unbounded)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if prev != nil {
			if err := prev(c, args); err != nil {
				return err
			}
		}
		cfg.WAN.Join = wanJoin
		if policyPath != "" {
			p, err := sovereignty.Load(policyPath)
			if err != nil {
				return withCode(exitInvalid, fmt.Errorf("--policy: %w", err))
			}
			cfg.Policy = p
		}
		b, err := regional.ParseBacklogBounds(maxPending)
		if err != nil {
			return withCode(exitInvalid, fmt.Errorf("--%w", err))
		}
		cfg.Backlog = b
		return nil
	}
	cmd.AddCommand(newRegionListCmd(), newRegionStatusCmd(), newRegionShardsCmd(), newRegionSnapshotCmd())
}

func newRegionListCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the federation's regions (ask the global router, or a coordinator)",
		Long: `List every region the global router knows from the serf WAN pool: its
jurisdiction, labels, coordinators, health (up while one coordinator is alive
and answers), free capacity, largest node, and each priority class's pending
backlog against the region's bound. Each alive coordinator shows its member
status, whether it answers, its health and the shards it owns, as its WAN
tags say (published within about a second of a change; shown only for
coordinators that publish it): "c1(alive,answers,ok,86 shards)".

Against a coordinator, the answer is that coordinator's view: every region of
its WAN pool if it is in one (an alive coordinator counts as answering: a
coordinator does not probe the others' APIs as the router does), else its own
region only. 'apiary region status' shows how many shards each coordinator
owns (each schedules its own), 'apiary region shards' lists them.

STATE is the size of each region's etcd backend file and its quota
("12MiB/4.0GiB"), asked of one of the region's alive coordinators (within
2 s; "-" when none answered, or the region is down); 'apiary region
status' shows the part in use too. -o json prints the router's answer
with the same sizes filled in (state_size_bytes, state_in_use_bytes,
state_quota_bytes; 0 where "-").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ListRegionsResponse, error) {
					return c.ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
				})
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			fillRegionStates(ctx, o, resp.GetRegions())
			stop()
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				printRegions(w, cmd.ErrOrStderr(), resp.GetRegions())
			})
		},
	}
	o.addFlags(cmd)
	return cmd
}

// printRegions writes a table of regions to w (the STATE cell from each
// summary's state sizes, fillRegionStates; "-" when 0); a note to errw
// when there are none.
func printRegions(w, errw io.Writer, regions []*apiaryv1.RegionSummary) {
	t := newTable(w)
	fmt.Fprintln(t, "REGION\tJURISDICTION\tSTATUS\tCOORDINATORS\tNODES\tSTATE\tFREE CPU (m)\tFREE MEM (MiB)\tLARGEST NODE\tBACKLOG/BOUND (batch,standard,urgent)\tLABELS")
	for _, r := range regions {
		st := "up"
		if !r.GetUp() {
			st = "DOWN: " + r.GetDownReason()
		}
		var coords []string
		for _, c := range r.GetCoordinators() {
			s := c.GetId() + "(" + c.GetMemberStatus()
			if c.GetMemberStatus() == "alive" {
				if c.GetAnswers() {
					s += ",answers"
				} else {
					s += ",no answer"
				}
				if h := c.GetHealth(); h != "" {
					s += "," + h
				}
				if n := c.GetShardsOwned(); n >= 0 {
					s += fmt.Sprintf(",%d shards", n)
				}
			}
			coords = append(coords, s+")")
		}
		var bl []string
		for _, b := range r.GetBacklog() {
			p, bound := "?", "-"
			if b.GetPending() >= 0 {
				p = fmt.Sprint(b.GetPending())
			}
			if b.GetBound() > 0 {
				bound = fmt.Sprint(b.GetBound())
			}
			bl = append(bl, p+"/"+bound)
		}
		l := r.GetLargestNode()
		// COORDINATORS up to 240 bytes: five with their state and shards.
		stateCell := fmtStateShort(r.GetStateSizeBytes(), r.GetStateQuotaBytes())
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%dm/%dMiB/%dgpu\t%s\t%s\n", r.GetName(), cell(r.GetJurisdiction(), 0),
			cell(st, 100), cell(strings.Join(coords, " "), 240), r.GetNodesReady(), stateCell,
			r.GetFree().GetCpuMillis(), r.GetFree().GetMemoryMb(), l.GetCpuMillis(), l.GetMemoryMb(), l.GetGpus(),
			cell(strings.Join(bl, " "), 0), cell(fmtLabels(r.GetLabels()), 60))
	}
	t.Flush()
	if len(regions) == 0 {
		fmt.Fprintln(errw, "no regions in the WAN pool yet")
	}
}

func newRegionStatusCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a region's coordinators, the shards each owns, the etcd leader and node counts (ask its coordinators)",
		Long: `Show the region whose coordinators --addr names: name, jurisdiction and
labels; its shard count (the S virtual shards of its job keyspace, fixed at
creation) with how many shards each live coordinator owns, how many no live
coordinator owns ("unowned"), and the highest fencing epoch of any shard (it
grows with every claim, so a takeover shows as a change); the etcd raft
leader (often another member); ready and registered nodes; pending tasks;
the region's state in etcd ("State": the backend file's size as the
answering coordinator's member reports it, the part in use (the rest is
free pages that a defragmentation returns) and the quota past which etcd
refuses writes); then each live coordinator (one holding an etcd session) with its API
address, whether that API answers a health check now (within 1 s), and the
shards it owns (SHARDS; ROLE "scheduler" when it owns at least one).

Ownership is sharded: a rendezvous hash of the live members gives each
coordinator about S/n shards, and each one places the tasks of its own
shards. A coordinator that joins gets its share a few seconds after it
joined. When one dies, only its shards move: the others keep scheduling
theirs, and the survivors claim the dead one's shards about half a second
later (about 1.2 s when it also hosted the etcd raft leader) when its API
refuses connections (--suspect-after) or its LAN member fails, else when its
session lease (--owner-lease-ttl) ends; until then those shards stay counted
for the dead member, whose API shows "no answer", and their tasks wait.
'apiary region shards' lists every shard with its owner and epoch. Give every coordinator's address (--addr a,b,c) so
that the answer does not depend on one member. A global router does not
serve this: against one, it exits 2 and names each region's coordinator
addresses.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var code codes.Code
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.GetRegionInfoResponse, error) {
					r, err := c.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
					code = status.Code(err)
					return r, err
				})
			if err != nil && code == codes.Unimplemented {
				return routerHint(cmd, o, "status")
			}
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				ctx, stop := signalContext(cmd)
				defer stop()
				printRegionStatus(w, resp, probeCoordinators(ctx, o, resp.GetRegion(), resp.GetCoordinators()))
			})
		},
	}
	o.addFlags(cmd)
	return cmd
}

// routerHint is the answer of `apiary region <sub>`, a command that a
// region's coordinators serve (status, shards), when --addr is a global
// router (the call is UNIMPLEMENTED there): exit 2, naming for each region
// the same command with its coordinators' addresses.
func routerHint(cmd *cobra.Command, o *clientOpts, sub string) error {
	addr := cliconn.ResolveAddr(o.addr, cmd.Flag("addr").Changed)
	var hints []string
	resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
		func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ListRegionsResponse, error) {
			return c.ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
		})
	if err == nil {
		for _, r := range resp.GetRegions() {
			var addrs []string
			for _, c := range r.GetCoordinators() {
				addrs = append(addrs, c.GetApiAddr())
			}
			hints = append(hints, fmt.Sprintf("\n  apiary region %s --addr %s   # %s", sub, strings.Join(addrs, ","), r.GetName()))
		}
	}
	return withCode(exitInvalid, fmt.Errorf("%s is a global router; region %s asks a region's coordinators: "+
		"give their API addresses (apiary region list -o json shows them)%s", addr, sub, strings.Join(hints, "")))
}

// probeTimeout bounds region status's health check of each coordinator.
const probeTimeout = time.Second

// probeCoordinators asks each coordinator's API for its gRPC health, all at
// once, each within probeTimeout: "answers", or "no answer" and why, by id.
// It dials with o's TLS files, verifying region.<region>.apiary.
func probeCoordinators(ctx context.Context, o *clientOpts, region string, coords []*apiaryv1.Coordinator) map[string]string {
	out := make(map[string]string, len(coords))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range coords {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := "answers"
			cc, err := o.dial(c.GetApiAddr(), pki.RegionServerName(region))
			if err == nil {
				pctx, cancel := context.WithTimeout(ctx, probeTimeout)
				_, err = healthpb.NewHealthClient(cc).Check(pctx, &healthpb.HealthCheckRequest{})
				cancel()
				cc.Close()
			}
			if err != nil {
				res = "no answer"
				if cliconn.NotConnected(err) {
					res += " (connection refused)"
				} else if status.Code(err) == codes.DeadlineExceeded {
					res += fmt.Sprintf(" (none within %s)", probeTimeout)
				}
			}
			mu.Lock()
			out[c.GetId()] = res
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// printRegionStatus writes GetRegionInfo as a header and a table of the
// coordinators; api holds each one's probe result by id.
func printRegionStatus(w io.Writer, r *apiaryv1.GetRegionInfoResponse, api map[string]string) {
	h := newTable(w)
	fmt.Fprintf(h, "Region:\t%s\n", r.GetRegion())
	fmt.Fprintf(h, "Jurisdiction:\t%s\n", cell(r.GetJurisdiction(), 0))
	fmt.Fprintf(h, "Labels:\t%s\n", cell(fmtLabels(r.GetLabels()), 0))
	fmt.Fprintf(h, "Shards:\t%s\n", shardOwnership(r))
	fmt.Fprintf(h, "etcd leader:\t%s\n", cell(r.GetEtcdLeader(), 0))
	fmt.Fprintf(h, "Nodes:\t%d ready, %d registered\n", r.GetNodesReady(), r.GetNodesRegistered())
	fmt.Fprintf(h, "Pending tasks:\t%s\n", fmtPending(r))
	fmt.Fprintf(h, "State:\t%s\n", fmtState(r.GetStateSizeBytes(), r.GetStateInUseBytes(), r.GetStateQuotaBytes()))
	h.Flush()
	fmt.Fprintln(w)
	t := newTable(w)
	fmt.Fprintln(t, "COORDINATOR\tAPI ADDRESS\tAPI\tSHARDS\tROLE")
	for _, c := range r.GetCoordinators() {
		var roles []string
		if c.GetScheduler() {
			roles = append(roles, "scheduler")
		}
		if c.GetId() == r.GetEtcdLeader() {
			roles = append(roles, "etcd leader")
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%s\n", c.GetId(), cell(c.GetApiAddr(), 0), cell(api[c.GetId()], 0), c.GetShardsOwned(),
			cell(strings.Join(roles, ", "), 0))
	}
	t.Flush()
}

// shardOwnership is region status's "Shards:" value: the shard count, then
// the shards each live coordinator owns (those owning none left out), the
// shards no live coordinator owns, and the highest shard epoch, e.g.
// "256 (c1 86, c2 85, c3 85; highest epoch 123)".
func shardOwnership(r *apiaryv1.GetRegionInfoResponse) string {
	var owners []string
	var owned int32
	live := false
	for _, c := range r.GetCoordinators() {
		live = live || c.GetId() == r.GetScheduler()
		if n := c.GetShardsOwned(); n > 0 {
			owners = append(owners, fmt.Sprintf("%s %d", c.GetId(), n))
			owned += n
		}
	}
	var parts []string
	if len(owners) > 0 {
		parts = append(parts, strings.Join(owners, ", "))
	}
	if un := r.GetShardCount() - owned; un > 0 {
		u := fmt.Sprintf("unowned: %d", un)
		if owned == 0 {
			u += " (no live coordinator owns a shard: the members are starting or claiming)"
		}
		parts = append(parts, u)
	}
	if e := r.GetSchedulerEpoch(); e > 0 {
		parts = append(parts, fmt.Sprintf("highest epoch %d", e))
	}
	s := fmt.Sprintf("%d (%s)", r.GetShardCount(), strings.Join(parts, "; "))
	if id := r.GetScheduler(); id != "" && !live {
		s += fmt.Sprintf("; %s owns shards but its member record has lapsed: it is probably dead, and the others claim its shards when its owner lease ends", id)
	}
	return s
}

// fmtPending is the pending task count, with how old it is when the
// answering coordinator's job index lagged etcd (pending_revision below
// revision).
func fmtPending(r *apiaryv1.GetRegionInfoResponse) string {
	switch pr := r.GetPendingRevision(); {
	case pr < 0:
		return "unknown (the coordinator's job index is loading)"
	case pr > 0 && pr < r.GetRevision():
		return fmt.Sprintf("%d (as of revision %d of %d: the coordinator's job index lags etcd)", r.GetPendingTasks(), pr, r.GetRevision())
	}
	return fmt.Sprint(r.GetPendingTasks())
}
