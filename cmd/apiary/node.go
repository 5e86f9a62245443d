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
	"time"

	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func init() { register(newNodeCmd) }

// listNodes is ListNodes against o's address, with a warning on stderr
// naming the regions that did not answer (their <what> are missing).
func listNodes(cmd *cobra.Command, o *clientOpts, what string) (*apiaryv1.ListNodesResponse, error) {
	resp, err := unaryCall(cmd, o, nil, apiaryv1.NewAdminServiceClient, "",
		func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.ListNodesResponse, error) {
			return c.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
		})
	if err != nil {
		return nil, err
	}
	if u := resp.GetUnavailableRegions(); len(u) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: these regions did not answer, their %s are missing: %s\n", what, strings.Join(u, ", "))
	}
	return resp, nil
}

func newNodeCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Inspect, quarantine, drain and turn eligibility of the nodes of a region (or of every region, through the router)",
	}
	o.addFlags(cmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List nodes with region, status, capacity, allocation and scheduling state",
		Long: `List nodes with their region, status, capacity, allocation and scheduling
state: eligible, DRAINING (until when), INELIGIBLE, QUARANTINED (since when,
why; "automatic" with its strike and when its canary is due when the region
quarantined it for failing attempts of several jobs far more often than the
rest of the region). FAILED is failed/ended attempts on the node within the
attribution window (--quarantine-window of the region).

Against a region's coordinators: that region's nodes. Against the global
router: every region's nodes (the router asks each region); regions that did
not answer are named on stderr and their nodes are missing. A node whose lease
lapsed shows DOWN and stays listed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := listNodes(cmd, o, "nodes")
			if err != nil {
				return err
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
	var (
		deadline    time.Duration
		cancelDrain bool
	)
	dc := &cobra.Command{
		Use:   "drain NODE [--deadline D] | drain NODE --cancel",
		Short: "Drain a node: no new placements; running attempts stop at the deadline and are requeued",
		Long: `Drain a node (Nomad's node drain): it gets no new placements at once; its
running attempts may finish until --deadline (default 0: stop them now),
then its agent stops the rest and hands them back as DRAINED: they are
requeued at once and not charged to their max_attempts. "node list" shows
DRAINING until the deadline, then DRAINED: the node stays drained (no new
placements) until "--cancel". The drain is stored in the node's record (it
survives coordinator restarts and the agent registering again) and leaves
the node ineligible: after "--cancel" it still gets no placements until
"apiary node eligibility NODE --enable".

An agent stopped with SIGTERM drains itself the same way (its
--drain-deadline), then releases its lease.

Against the global router: the one region that has the node.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := unaryCall(cmd, o, func() error {
				if deadline < 0 || deadline > 7*24*time.Hour {
					return withCode(exitInvalid, fmt.Errorf("--deadline: must be between 0 (stop now) and 168h (7 days), got %s", deadline))
				}
				if cancelDrain && cmd.Flags().Changed("deadline") {
					return withCode(exitInvalid, errors.New("--deadline and --cancel: give one or the other"))
				}
				return nil
			}, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.DrainNodeResponse, error) {
					req := &apiaryv1.DrainNodeRequest{NodeId: args[0], Cancel: cancelDrain, By: operatorName()}
					if !cancelDrain && deadline > 0 {
						req.DeadlineMs = time.Now().Add(deadline).UnixMilli()
					}
					return c.DrainNode(ctx, req)
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				n := resp.GetNode()
				switch {
				case !n.GetDraining() && n.GetIneligible():
					fmt.Fprintf(w, "node %s is not draining; it stays ineligible until \"apiary node eligibility %s --enable\"\n", n.GetId(), n.GetId())
				case !n.GetDraining():
					fmt.Fprintf(w, "node %s is not draining and is eligible\n", n.GetId())
				case n.GetDrainDeadlineMs() == 0:
					fmt.Fprintf(w, "node %s draining: running attempts are being stopped and requeued\n", n.GetId())
				default:
					fmt.Fprintf(w, "node %s draining: running attempts stop at %s\n", n.GetId(), fmtTime(n.GetDrainDeadlineMs()))
				}
			})
		},
	}
	dc.Flags().DurationVar(&deadline, "deadline", 0, "let running attempts finish this long, then stop and requeue the rest (0: now)")
	dc.Flags().BoolVar(&cancelDrain, "cancel", false, "end the drain (the node stays ineligible)")
	cmd.AddCommand(dc)
	var enable, disable bool
	ec := &cobra.Command{
		Use:   "eligibility NODE --enable|--disable",
		Short: "Turn new placements on a node on or off (running attempts are not touched)",
		Long: `Turn new placements on a node on (--enable) or off (--disable), as Nomad's
node eligibility does; running attempts are not touched. Stored in the
node's record. A draining node cannot be made eligible: end the drain
first ("apiary node drain NODE --cancel"). Against the global router: the
one region that has the node.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := unaryCall(cmd, o, func() error {
				if enable == disable {
					return withCode(exitInvalid, errors.New("--enable or --disable: give exactly one"))
				}
				return nil
			}, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.SetNodeEligibilityResponse, error) {
					return c.SetNodeEligibility(ctx, &apiaryv1.SetNodeEligibilityRequest{NodeId: args[0], Eligible: enable, By: operatorName()})
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				n := resp.GetNode()
				state := "eligible"
				if n.GetIneligible() {
					state = "ineligible"
				}
				fmt.Fprintf(w, "node %s is %s", n.GetId(), state)
				if n.GetDraining() {
					fmt.Fprint(w, " (and draining)")
				}
				fmt.Fprintln(w)
			})
		},
	}
	ec.Flags().BoolVar(&enable, "enable", false, "allow new placements")
	ec.Flags().BoolVar(&disable, "disable", false, "stop new placements")
	cmd.AddCommand(ec)
	return cmd
}

// reqLim is a node list cell "REQUESTED/LIMIT", the limit "-" when 0
// (no running task has one).
func reqLim(req, lim int64) string {
	if lim <= 0 {
		return fmt.Sprintf("%d/-", req)
	}
	return fmt.Sprintf("%d/%d", req, lim)
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
// CPU (m) and MEMORY (MiB) are the running tasks' requests over the node's
// capacity; CPU REQ/LIM (m) and MEM REQ/LIM (MiB) the same requests beside
// the sum of their limits (Node.limits, Kubernetes' "Allocated resources"),
// "-" when none of them has a limit: limits above capacity are Burstable
// tasks' overcommit.
func printNodes(w, errw io.Writer, nodes []*apiaryv1.Node) {
	t := newTable(w)
	fmt.Fprintln(t, "REGION\tID\tSTATUS\tEPOCH\tCPU (m)\tMEMORY (MiB)\tCPU REQ/LIM (m)\tMEM REQ/LIM (MiB)\tGPUS\tTASKS\tFAILED\tSCHEDULING\tLABELS")
	for _, n := range nodes {
		st := strings.TrimPrefix(n.GetStatus().String(), "NODE_STATUS_")
		var sched []string
		if n.GetDraining() {
			d := "DRAINING"
			switch ms := n.GetDrainDeadlineMs(); {
			case ms > 0 && ms > time.Now().UnixMilli():
				d += " until " + fmtTime(ms)
			case ms > 0:
				d = "DRAINED since " + fmtTime(ms)
			default:
				d = "DRAINED"
			}
			sched = append(sched, d)
		} else if n.GetIneligible() {
			sched = append(sched, "INELIGIBLE")
		}
		if n.GetQuarantined() {
			q := "QUARANTINED"
			width := 60
			if n.GetQuarantineAutomatic() {
				// The rule's own reason is the point: keep it whole.
				q += " (automatic, strike " + fmt.Sprint(n.GetQuarantineStrikes())
				if ms := n.GetQuarantineProbeTimeMs(); ms > time.Now().UnixMilli() {
					q += ", canary in " + time.Until(time.UnixMilli(ms)).Round(time.Second).String()
				} else {
					q += ", canary due"
				}
				q += ")"
				width = 160
			}
			if ms := n.GetQuarantinedTimeMs(); ms > 0 {
				q += " since " + fmtTime(ms)
			}
			if r := n.GetQuarantineReason(); r != "" {
				q += ": " + cell(r, width)
			}
			sched = append(sched, q)
		}
		q := "eligible"
		if len(sched) > 0 {
			q = strings.Join(sched, "; ")
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
		// FAILED: failed of ended attempts in the attribution window.
		failed := fmt.Sprintf("%d/%d", n.GetRecentFailures(), n.GetRecentAttempts())
		fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(n.GetRegion(), 0), n.GetId(), st, n.GetEpoch(),
			n.GetAllocated().GetCpuMillis(), n.GetCapacity().GetCpuMillis(),
			n.GetAllocated().GetMemoryMb(), n.GetCapacity().GetMemoryMb(),
			reqLim(n.GetAllocated().GetCpuMillis(), n.GetLimits().GetCpuMillis()),
			reqLim(n.GetAllocated().GetMemoryMb(), n.GetLimits().GetMemoryMb()),
			gpus, tasks, failed, q, cell(fmtLabels(n.GetLabels()), 80))
	}
	t.Flush()
	if len(nodes) == 0 {
		fmt.Fprintln(errw, "no nodes")
	}
}
