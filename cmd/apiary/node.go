package main

// apiary node list: the client side of AdminService.ListNodes.

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func init() { register(newNodeCmd) }

func newNodeCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Inspect the nodes of a region",
	}
	o.addFlags(cmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List nodes with status, capacity, allocation and quarantine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			cc, addr, err := o.conn(cmd)
			if err != nil {
				return err
			}
			defer cc.Close()
			ctx, stop := signalContext(cmd)
			defer stop()
			client := apiaryv1.NewAdminServiceClient(cc)
			var resp *apiaryv1.ListNodesResponse
			err = o.call(ctx, func(ctx context.Context) error {
				resp, err = client.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
				return err
			})
			if err != nil {
				return rpcError(err, addr, "")
			}
			if o.output == "json" {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			t := newTable(cmd.OutOrStdout())
			fmt.Fprintln(t, "ID\tSTATUS\tEPOCH\tCPU (m)\tMEMORY (MiB)\tGPUS\tTASKS\tQUARANTINE\tLABELS")
			for _, n := range resp.GetNodes() {
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
					if m := n.GetGpuModel(); m != "" {
						gpus += " " + m
					}
				}
				tasks := fmt.Sprint(n.GetRunningTasks())
				if m := n.GetMaxTasks(); m > 0 {
					tasks += fmt.Sprintf("/%d", m)
				}
				fmt.Fprintf(t, "%s\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\t%s\n", n.GetId(), st, n.GetEpoch(),
					n.GetAllocated().GetCpuMillis(), n.GetCapacity().GetCpuMillis(),
					n.GetAllocated().GetMemoryMb(), n.GetCapacity().GetMemoryMb(),
					gpus, tasks, q, cell(fmtLabels(n.GetLabels()), 80))
			}
			t.Flush()
			if len(resp.GetNodes()) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no nodes")
			}
			return nil
		},
	})
	return cmd
}
