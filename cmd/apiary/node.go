package main

// apiary node list: the client side of AdminService.ListNodes (a region's
// coordinators, or the global router, which asks every region).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func init() { register(newNodeCmd) }

func newNodeCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Inspect and quarantine the nodes of a region, or of every region through the router",
	}
	o.addFlags(cmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List nodes with region, status, capacity, allocation and quarantine",
		Long: `List nodes with their region, status, capacity, allocation and quarantine.

Against a region's coordinators: that region's nodes. Against the global
router: every region's nodes (the router asks each region); regions that did
not answer are named on stderr and their nodes are missing. A node whose lease
lapsed shows DOWN and stays listed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ListNodesResponse, error) {
					return c.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
				})
			if err != nil {
				return err
			}
			if u := resp.GetUnavailableRegions(); len(u) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: these regions did not answer, their nodes are missing: %s\n", strings.Join(u, ", "))
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) { printNodes(w, cmd.ErrOrStderr(), resp.GetNodes()) })
		},
	})
	var reason string
	qc := &cobra.Command{
		Use:   "quarantine NODE --reason TEXT",
		Short: "Stop new placements on a node until it is released",
		Long: `Quarantine a node: it gets no new placements until "apiary node release";
attempts already running on it continue. The quarantine is stored in the
node's record with the reason, who asked ($USER@host) and when, so it
survives coordinator restarts and the node registering again. Quarantining a
quarantined node replaces the reason and keeps since when.

Against a region's coordinators: that region's node. Against the global
router: the one region that has a node of that id (the router asks every
region); refused when several regions have one (use that region's address).

--reason is required: 1-256 bytes, one line.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := unaryCall(cmd, o, func() error {
				if strings.TrimSpace(reason) == "" {
					return withCode(exitInvalid, errors.New("--reason: is required (why the node is quarantined)"))
				}
				return nil
			}, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.QuarantineNodeResponse, error) {
					return c.QuarantineNode(ctx, &apiaryv1.QuarantineNodeRequest{NodeId: args[0], Reason: reason, By: operatorName()})
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				n := resp.GetNode()
				fmt.Fprintf(w, "node %s quarantined since %s: %s\n", n.GetId(), fmtTime(n.GetQuarantinedTimeMs()), n.GetQuarantineReason())
			})
		},
	}
	qc.Flags().StringVar(&reason, "reason", "", "why the node is quarantined (required; 1-256 bytes, one line)")
	cmd.AddCommand(qc)
	cmd.AddCommand(&cobra.Command{
		Use:   "release NODE",
		Short: "End a node's quarantine: it gets placements again",
		Long: `End a node's quarantine: it gets new placements again. Releasing a node
that is not quarantined changes nothing and says so. Against the global
router: as "node quarantine".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ReleaseNodeResponse, error) {
					return c.ReleaseNode(ctx, &apiaryv1.ReleaseNodeRequest{NodeId: args[0], By: operatorName()})
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				if resp.GetWasQuarantined() {
					fmt.Fprintf(w, "node %s released\n", resp.GetNode().GetId())
				} else {
					fmt.Fprintf(w, "node %s was not quarantined; nothing changed\n", resp.GetNode().GetId())
				}
			})
		},
	})
	return cmd
}

// operatorName is who asks, for the quarantine record: $USER@host (at most
// 128 bytes).
func operatorName() string {
	u := os.Getenv("USER")
	if u == "" {
		u = "unknown"
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		u += "@" + h
	}
	if len(u) > 128 {
		u = u[:128]
	}
	return strings.ToValidUTF8(u, "?")
}

// printNodes writes a table of nodes to w; "no nodes" to errw when there are none.
func printNodes(w, errw io.Writer, nodes []*apiaryv1.Node) {
	t := newTable(w)
	fmt.Fprintln(t, "REGION\tID\tSTATUS\tEPOCH\tCPU (m)\tMEMORY (MiB)\tGPUS\tTASKS\tQUARANTINE\tLABELS")
	for _, n := range nodes {
		st := strings.TrimPrefix(n.GetStatus().String(), "NODE_STATUS_")
		q := "-"
		if n.GetQuarantined() {
			q = "QUARANTINED"
			if ms := n.GetQuarantinedTimeMs(); ms > 0 {
				q += " since " + fmtTime(ms)
			}
			if r := n.GetQuarantineReason(); r != "" {
				q += ": " + cell(r, 60)
			}
		}
		gpus := "-"
		if c := n.GetCapacity().GetGpus(); c > 0 {
			gpus = fmt.Sprintf("%d/%d", n.GetAllocated().GetGpus(), c)
			if sh := n.GetAllocated().GetGpuMilli(); sh > 0 {
				gpus += fmt.Sprintf(" +%.2f shared", float64(sh)/1000)
			}
			if m := n.GetGpuModel(); m != "" {
				gpus += " " + m
			}
		}
		tasks := fmt.Sprint(n.GetRunningTasks())
		if m := n.GetMaxTasks(); m > 0 {
			tasks += fmt.Sprintf("/%d", m)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\t%s\n", cell(n.GetRegion(), 0), n.GetId(), st, n.GetEpoch(),
			n.GetAllocated().GetCpuMillis(), n.GetCapacity().GetCpuMillis(),
			n.GetAllocated().GetMemoryMb(), n.GetCapacity().GetMemoryMb(),
			gpus, tasks, q, cell(fmtLabels(n.GetLabels()), 80))
	}
	t.Flush()
	if len(nodes) == 0 {
		fmt.Fprintln(errw, "no nodes")
	}
}
