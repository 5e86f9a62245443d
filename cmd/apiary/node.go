package main

// apiary node list: the client side of AdminService.ListNodes (a region's
// coordinators, or the global router, which asks every region).

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func init() { register(newNodeCmd) }

func newNodeCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Inspect the nodes of a region, or of every region through the router",
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
	return cmd
}

// printNodes writes a table of nodes to w; "no nodes" to errw when there are none.
func printNodes(w, errw io.Writer, nodes []*apiaryv1.Node) {
	t := newTable(w)
	fmt.Fprintln(t, "REGION\tID\tSTATUS\tEPOCH\tCPU (m)\tMEMORY (MiB)\tGPUS\tTASKS\tQUARANTINE\tLABELS")
	for _, n := range nodes {
		st := strings.TrimPrefix(n.GetStatus().String(), "NODE_STATUS_")
		q := "-"
		if n.GetQuarantined() {
			q = "yes"
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
