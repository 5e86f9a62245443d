package main

// `apiary region shards`: the region's virtual shards, their owners and
// fencing epochs (AdminService.ListShards on a region's coordinators).

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
)

func newRegionShardsCmd() *cobra.Command {
	o := &clientOpts{}
	var all bool
	cmd := &cobra.Command{
		Use:   "shards",
		Short: "List a region's shards: the coordinator owning each, its fencing epoch, its tasks (ask its coordinators)",
		Long: `List the region's S virtual shards (its job keyspace split by hash range,
fixed at creation) as the coordinator that answers sees them: the owner of
each shard (its owner key /apiary/shards/<s>/owner) and the shard's fencing
epoch (that key's create revision: every write for the shard compares it,
so a coordinator that lost the shard cannot write for it), and, from that
coordinator's watch cache, the shard's pending and running (assigned or
running) tasks and how long ago a task of it was last placed.

The first line names the coordinator that answered and the etcd revision
its owners view was read at. Then one row per owning coordinator: the
shards it owns, their lowest-highest epoch, their pending and running tasks
and its latest placement; a "(none)" row counts the shards no coordinator
owns (between a lost owner lease and the next claim: their tasks wait). A
live coordinator that owns no shard yet (one that has just joined) has no
row: 'apiary region status' lists every live coordinator.

--all adds one row per shard: SHARD, OWNER ("(none)" when unowned), EPOCH,
PENDING, RUNNING, LAST PLAN ("3s ago"; "-" when the cache holds no placed
task of the shard). -o json prints the whole answer (every shard).

A global router does not serve this: against one, it exits 2 and names each
region's coordinator addresses.`,
		Example: `  apiary region shards --addr 127.0.0.1:7071,127.0.0.1:7072,127.0.0.1:7073
  apiary region shards --all --addr 127.0.0.1:7071`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var code codes.Code
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ListShardsResponse, error) {
					r, err := c.ListShards(ctx, &apiaryv1.ListShardsRequest{})
					code = status.Code(err)
					return r, err
				})
			if err != nil && code == codes.Unimplemented {
				return shardsUnimplemented(cmd, o)
			}
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) { printRegionShards(w, resp, all, time.Now()) })
		},
	}
	o.addFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "also list every shard, one row each (text output; -o json always has every shard)")
	return cmd
}

// shardsUnimplemented answers a ListShards that --addr does not serve: a
// coordinator that serves GetRegionInfo is an older one (exit 2 saying so),
// anything else is taken for a global router (routerHint).
func shardsUnimplemented(cmd *cobra.Command, o *clientOpts) error {
	if _, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
		func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.GetRegionInfoResponse, error) {
			return c.GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
		}); err == nil {
		addr := cliconn.ResolveAddr(o.addr, cmd.Flag("addr").Changed)
		return withCode(exitInvalid, fmt.Errorf("the coordinator at %s does not serve region shards (AdminService.ListShards): "+
			"it runs an older apiary; 'apiary region status' shows how many shards each coordinator owns", addr))
	}
	return routerHint(cmd, o, "shards")
}

// shardGroup is one row of region shards' summary: the shards of one owner.
type shardGroup struct {
	owner            string // "" for the unowned shards
	shards           int
	minEpoch         int64
	maxEpoch         int64
	pending, running int64
	lastPlanMs       int64
}

// printRegionShards writes ListShards as a header line, a summary row per
// owner (by id; the unowned shards last, as "(none)") and, with all, a row
// per shard. Ages of LAST PLAN are taken at now.
func printRegionShards(w io.Writer, r *apiaryv1.ListShardsResponse, all bool, now time.Time) {
	groups := map[string]*shardGroup{}
	for _, s := range r.GetShards() {
		g := groups[s.GetOwner()]
		if g == nil {
			g = &shardGroup{owner: s.GetOwner(), minEpoch: s.GetEpoch(), maxEpoch: s.GetEpoch()}
			groups[s.GetOwner()] = g
		}
		g.shards++
		g.minEpoch, g.maxEpoch = min(g.minEpoch, s.GetEpoch()), max(g.maxEpoch, s.GetEpoch())
		g.pending += int64(s.GetPendingTasks())
		g.running += int64(s.GetRunningTasks())
		g.lastPlanMs = max(g.lastPlanMs, s.GetLastPlanMs())
	}
	owners := make([]string, 0, len(groups))
	for id := range groups {
		owners = append(owners, id)
	}
	slices.SortFunc(owners, func(a, b string) int {
		if (a == "") != (b == "") { // the unowned last
			if a == "" {
				return 1
			}
			return -1
		}
		return cmp.Compare(a, b)
	})
	head := fmt.Sprintf("%d shards, answered by %s at etcd revision %d", r.GetShardCount(), cell(r.GetCoordinator(), 0), r.GetRevision())
	if g := groups[""]; g != nil {
		head += fmt.Sprintf("; unowned: %d (their tasks wait for a claim)", g.shards)
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w)
	t := newTable(w)
	fmt.Fprintln(t, "COORDINATOR\tSHARDS\tEPOCHS\tPENDING\tRUNNING\tLAST PLAN")
	for _, id := range owners {
		g := groups[id]
		epochs := "-"
		if id != "" {
			epochs = fmt.Sprint(g.minEpoch)
			if g.maxEpoch != g.minEpoch {
				epochs += fmt.Sprintf("-%d", g.maxEpoch)
			}
		}
		fmt.Fprintf(t, "%s\t%d\t%s\t%d\t%d\t%s\n", ownerName(id), g.shards, epochs, g.pending, g.running, fmtAgo(g.lastPlanMs, now))
	}
	t.Flush()
	if !all {
		return
	}
	fmt.Fprintln(w)
	t = newTable(w)
	fmt.Fprintln(t, "SHARD\tOWNER\tEPOCH\tPENDING\tRUNNING\tLAST PLAN")
	for _, s := range r.GetShards() {
		epoch := "-"
		if s.GetEpoch() > 0 {
			epoch = fmt.Sprint(s.GetEpoch())
		}
		fmt.Fprintf(t, "%d\t%s\t%s\t%d\t%d\t%s\n", s.GetShard(), ownerName(s.GetOwner()), epoch, s.GetPendingTasks(),
			s.GetRunningTasks(), fmtAgo(s.GetLastPlanMs(), now))
	}
	t.Flush()
}

// ownerName is a shard owner's id as a table cell: "(none)" when unowned.
func ownerName(id string) string {
	if id == "" {
		return "(none)"
	}
	return cell(id, 0)
}

// fmtAgo is the age at now of a Unix ms time, in whole seconds, as "3s ago"
// or "2m5s ago" ("0s ago" for a time ahead of now, a clock skew); "-" for 0.
func fmtAgo(ms int64, now time.Time) string {
	if ms <= 0 {
		return "-"
	}
	age := max(now.Sub(time.UnixMilli(ms)).Round(time.Second), 0)
	return age.String() + " ago"
}
