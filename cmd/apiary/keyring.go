package main

// apiary keygen and apiary keyring list|install|use|remove: the gossip
// encryption keys of the serf pools (as `consul keygen` and `consul
// keyring`), and the --gossip-key / --gossip-keyring-file flags of the
// server roles (region, global, agent). The keyring commands are the client
// side of AdminService.GossipKeyring, served by a region's coordinators
// (regional/keyring.go), which act through serf's KeyManager on every
// member of their LAN pool and of the WAN pool.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
)

func init() {
	register(newKeygenCmd)
	register(newKeyringCmd)
}

// EnvGossipKey is --gossip-key's fallback. The server roles remove it from
// their own environment once read, so an agent's tasks never inherit it.
const EnvGossipKey = "APIARY_GOSSIP_KEY"

// exitKeyringFailed: some member of a pool did not apply a keyring change
// (or did not answer); the command printed which.
const exitKeyringFailed = 1

func newKeygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new gossip encryption key (base64, 32 bytes) for --gossip-key",
		Long: `Print a new random 32-byte key in standard base64, for the serf pools'
gossip encryption (AES-256-GCM, as "consul keygen" makes): give the same key
to every coordinator, agent and router as --gossip-key (or $` + EnvGossipKey + `).
To change the key of running pools, see "apiary keyring".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := federation.GenerateGossipKey()
			if err != nil {
				return withCode(exitUnavailable, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), k)
			return nil
		},
	}
}

// gossipFlags are --gossip-key and --gossip-keyring-file of a server role.
type gossipFlags struct {
	key  string
	file string
}

// add registers the flags; fileHelp says where the keyring file is kept
// by default.
func (g *gossipFlags) add(cmd *cobra.Command, fileHelp string) {
	f := cmd.Flags()
	f.StringVar(&g.key, "gossip-key", "", "encrypt the serf gossip with this key (base64 of 16, 24 or 32 bytes: apiary keygen); "+
		"every member of a pool needs it (default $"+EnvGossipKey+"; none: plain text unless the keyring file exists)")
	f.StringVar(&g.file, "gossip-keyring-file", "", fileHelp)
}

// resolve returns the key of --gossip-key, else of $APIARY_GOSSIP_KEY, or
// nil for none; it removes the variable from the process's environment
// (an agent's tasks inherit it otherwise). A malformed key exits 2 naming
// where it came from, never repeating it.
func (g *gossipFlags) resolve(cmd *cobra.Command) ([]byte, error) {
	s, from := g.key, "--gossip-key"
	env, inEnv := os.LookupEnv(EnvGossipKey)
	_ = os.Unsetenv(EnvGossipKey)
	if !cmd.Flags().Changed("gossip-key") {
		if !inEnv {
			return nil, nil
		}
		s, from = env, "$"+EnvGossipKey
	}
	if strings.TrimSpace(s) == "" {
		return nil, withCode(exitInvalid, fmt.Errorf("%s: empty key (make one with `apiary keygen`, or leave it unset for plain-text gossip)", from))
	}
	k, err := federation.DecodeGossipKey(s)
	if err != nil {
		return nil, withCode(exitInvalid, fmt.Errorf("%s: %w", from, err))
	}
	return k, nil
}

func newKeyringCmd() *cobra.Command {
	o := &clientOpts{}
	var pool string
	cmd := &cobra.Command{
		Use:   "keyring",
		Short: "List or rotate the gossip encryption keys of the serf pools (through a coordinator)",
		Long: `List or change the gossip keyring of the serf pools through one of a
region's coordinators (--addr): its region's LAN pool (coordinators and
agents) and the WAN pool (every region's coordinators and the routers),
or only one of them with --pool. Each change is a serf query that reaches
every member of the pool; each member that keeps a keyring file
(--gossip-keyring-file) rewrites it, so the change survives restarts.

KEY "-" reads the key from standard input, so that it appears on no command
line (apiary keygen | tee new.key | apiary keyring install -).

Rotating the key, as serf does it:
  apiary keygen                       # NEW
  apiary keyring install NEW          # every member accepts NEW, still sends with OLD
  apiary keyring use NEW              # every member sends with NEW
  apiary keyring remove OLD           # OLD is forgotten
  apiary keyring list                 # every member holds NEW only

Check that every step reached every member before the next: a member down
during the rotation keeps its old keyring and cannot rejoin once OLD is
removed (restart it with --gossip-key NEW and its keyring file removed).
Each region's LAN pool is rotated through one of its own coordinators. The
global router does not serve these commands. With TLS only a client
certificate (an operator) may run them. Exit 1 when some member did not
apply the change (each failure is printed), 2 for a bad key or a pool that
is not encrypted, 3 when the coordinator cannot be reached.`,
	}
	o.addFlags(cmd)
	cmd.PersistentFlags().StringVar(&pool, "pool", "", "lan or wan (default: both pools the coordinator runs)")
	run := func(op apiaryv1.GossipKeyringOp, keyArg bool) func(cmd *cobra.Command, args []string) error {
		return func(cmd *cobra.Command, args []string) error {
			req := &apiaryv1.GossipKeyringRequest{Op: op, Pool: pool}
			check := func() error {
				if pool != "" && pool != "lan" && pool != "wan" {
					return withCode(exitInvalid, fmt.Errorf("--pool: must be lan or wan (got %q)", pool))
				}
				if !keyArg {
					return nil
				}
				key := args[0]
				if key == "-" {
					// From standard input, so that the key is on no
					// command line (/proc/<pid>/cmdline is world-readable).
					b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 4096))
					if err != nil {
						return withCode(exitInvalid, fmt.Errorf("KEY -: reading standard input: %w", err))
					}
					key = string(b)
				}
				if _, err := federation.DecodeGossipKey(strings.TrimSpace(key)); err != nil {
					return withCode(exitInvalid, fmt.Errorf("KEY: %w", err))
				}
				req.Key = strings.TrimSpace(key)
				return nil
			}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewAdminServiceClient, "",
				func(ctx context.Context, c apiaryv1.AdminServiceClient) (*apiaryv1.GossipKeyringResponse, error) {
					r, err := c.GossipKeyring(ctx, req)
					if status.Code(err) == codes.Unimplemented {
						return nil, status.Error(codes.FailedPrecondition, "this server does not manage the gossip keyring "+
							"(a global router does not): give --addr of a region's coordinators, which act on their "+
							"region's LAN pool and on the WAN pool")
					}
					return r, err
				})
			if err != nil {
				return err
			}
			if err := o.print(cmd.OutOrStdout(), resp, func(w io.Writer) { printKeyring(w, op, req.Key, resp) }); err != nil {
				return err
			}
			var failed []string
			for _, p := range resp.GetPools() {
				if p.GetError() != "" {
					failed = append(failed, p.GetPool()+": "+p.GetError())
				}
			}
			if len(failed) > 0 {
				return withCode(exitKeyringFailed, errors.New("not every member applied it: "+strings.Join(failed, "; ")))
			}
			return nil
		}
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the keys the pools' members hold, and how many send with each",
		Args:  cobra.NoArgs,
		RunE:  run(apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST, false),
	}, &cobra.Command{
		Use:   "install KEY|-",
		Short: "Add KEY to every member's keyring (members keep sending with the primary key)",
		Args:  cobra.ExactArgs(1),
		RunE:  run(apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_INSTALL, true),
	}, &cobra.Command{
		Use:   "use KEY|-",
		Short: "Make KEY (installed everywhere) the key every member sends with",
		Args:  cobra.ExactArgs(1),
		RunE:  run(apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_USE, true),
	}, &cobra.Command{
		Use:   "remove KEY|-",
		Short: "Remove KEY (not the one in use) from every member's keyring",
		Args:  cobra.ExactArgs(1),
		RunE:  run(apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_REMOVE, true),
	})
	return cmd
}

// printKeyring writes what each pool's members answered.
func printKeyring(w io.Writer, op apiaryv1.GossipKeyringOp, key string, resp *apiaryv1.GossipKeyringResponse) {
	verb := map[apiaryv1.GossipKeyringOp]string{apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_INSTALL: "installed",
		apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_USE: "now in use", apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_REMOVE: "removed"}[op]
	for _, p := range resp.GetPools() {
		ok := p.GetResponses() - p.GetFailures()
		if op == apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST {
			fmt.Fprintf(w, "%s pool: %d members, %d answered\n", strings.ToUpper(p.GetPool()), p.GetMembers(), p.GetResponses())
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  KEY\tHELD BY\tPRIMARY FOR")
			keys := make([]string, 0, len(p.GetKeys()))
			for k := range p.GetKeys() {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(tw, "  %s\t%d/%d\t%d\n", k, p.GetKeys()[k], p.GetMembers(), p.GetPrimaryKeys()[k])
			}
			tw.Flush()
		} else {
			fmt.Fprintf(w, "%s pool: key %s %s on %d of %d members\n", strings.ToUpper(p.GetPool()), shortKey(key), verb, ok, p.GetMembers())
		}
		names := make([]string, 0, len(p.GetMessages()))
		for n := range p.GetMessages() {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(w, "  %s: %s\n", n, p.GetMessages()[n])
		}
		if p.GetError() != "" {
			fmt.Fprintf(w, "  error: %s\n", p.GetError())
		}
	}
}

// shortKey is the first 8 characters of a key, for messages.
func shortKey(k string) string {
	if len(k) > 8 {
		return k[:8] + "..."
	}
	return k
}
