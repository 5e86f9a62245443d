package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func init() { register(newDatasetCmd) }

func newDatasetCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "dataset",
		Short: "See which nodes hold which datasets (what data-locality placement reads)",
	}
	o.addFlags(cmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the datasets the nodes hold, with the nodes and bytes of each (Dask's who_has)",
		Long: `List every dataset some node holds: the nodes that hold it (region/node) and
the bytes of each copy. A node reports the subdirectories of its agent's
--dataset-dir at registration and when a rescan (every 10 s) finds a change;
a node whose epoch ended (DOWN) is left out, its datasets are gone with it.

Against a region's coordinators: that region's nodes. Against the global
router: every region's nodes; regions that did not answer are named on
stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := listNodes(cmd, o, "datasets")
			if err != nil {
				return err
			}
			out := datasetHolders(resp.GetNodes())
			return o.print(cmd.OutOrStdout(), out, func(w io.Writer) { printDatasets(w, out) })
		},
	})
	return cmd
}

// datasetHolders inverts the nodes' dataset lists: one entry per dataset
// with its holders (READY nodes only), sorted by dataset name, the holders
// by bytes (largest first) then region/node.
func datasetHolders(nodes []*apiaryv1.Node) *apiaryv1.DatasetList {
	by := map[string]*apiaryv1.DatasetHolders{}
	for _, n := range nodes {
		if n.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY {
			continue
		}
		for _, d := range n.GetDatasets() {
			h := by[d.GetName()]
			if h == nil {
				h = &apiaryv1.DatasetHolders{Name: d.GetName()}
				by[d.GetName()] = h
			}
			h.Holders = append(h.Holders, &apiaryv1.DatasetCopy{Region: n.GetRegion(), NodeId: n.GetId(), SizeBytes: d.GetSizeBytes()})
		}
	}
	out := &apiaryv1.DatasetList{}
	for _, name := range slices.Sorted(maps.Keys(by)) {
		h := by[name]
		slices.SortFunc(h.Holders, func(a, b *apiaryv1.DatasetCopy) int {
			if a.GetSizeBytes() != b.GetSizeBytes() {
				if a.GetSizeBytes() > b.GetSizeBytes() {
					return -1
				}
				return 1
			}
			return strings.Compare(a.GetRegion()+"/"+a.GetNodeId(), b.GetRegion()+"/"+b.GetNodeId())
		})
		out.Datasets = append(out.Datasets, h)
	}
	return out
}

func printDatasets(w io.Writer, resp *apiaryv1.DatasetList) {
	if len(resp.GetDatasets()) == 0 {
		fmt.Fprintln(w, "no node holds a dataset (agents report them with --dataset-dir)")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "DATASET\tREGION\tNODE\tBYTES")
	for _, d := range resp.GetDatasets() {
		for i, h := range d.GetHolders() {
			name := cell(d.GetName(), 80)
			if i > 0 {
				name = ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s (%d)\n", name, cell(h.GetRegion(), 0), h.GetNodeId(), humanize.IBytes(uint64(h.GetSizeBytes())), h.GetSizeBytes())
		}
	}
	tw.Flush()
}
