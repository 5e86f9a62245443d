package main

// The federation side of `apiary region`: the coordinator's WAN, policy and
// admission flags, and `apiary region list` (AdminService.ListRegions on the
// global router).

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/global/policy"
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
			p, err := policy.Load(policyPath)
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
	cmd.AddCommand(newRegionListCmd())
}

func newRegionListCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the federation's regions (ask the global router)",
		Long: `List every region the global router knows from the serf WAN pool: its
jurisdiction, labels, coordinators, health (up while one coordinator is alive
and answers), free capacity, largest node, and each priority class's pending
backlog against the region's bound. --addr must be a global router.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ListRegionsResponse, error) {
					return c.ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) { printRegions(w, cmd.ErrOrStderr(), resp.GetRegions()) })
		},
	}
	o.addFlags(cmd)
	return cmd
}

// printRegions writes a table of regions to w; a note to errw when there are none.
func printRegions(w, errw io.Writer, regions []*apiaryv1.RegionSummary) {
	t := newTable(w)
	fmt.Fprintln(t, "REGION\tJURISDICTION\tSTATUS\tCOORDINATORS\tNODES\tFREE CPU (m)\tFREE MEM (MiB)\tLARGEST NODE\tBACKLOG/BOUND (batch,standard,urgent)\tLABELS")
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
				s += "," + c.GetHealth()
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
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%dm/%dMiB/%dgpu\t%s\t%s\n", r.GetName(), cell(r.GetJurisdiction(), 0),
			cell(st, 100), cell(strings.Join(coords, " "), 120), r.GetNodesReady(),
			r.GetFree().GetCpuMillis(), r.GetFree().GetMemoryMb(), l.GetCpuMillis(), l.GetMemoryMb(), l.GetGpus(),
			cell(strings.Join(bl, " "), 0), cell(fmtLabels(r.GetLabels()), 60))
	}
	t.Flush()
	if len(regions) == 0 {
		fmt.Fprintln(errw, "no regions in the WAN pool yet")
	}
}
