package main

// apiary acl bootstrap | token create|list|revoke|self | policy
// apply|list|delete: the client side of ACLService (Nomad's ACL system:
// https://developer.hashicorp.com/nomad/docs/secure/acl). Through the
// global router every write goes to every region with the same ids, so one
// token works in every region (global/router/acl.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
)

func init() { register(newACLCmd) }

// exitACLPartial: an ACL write was taken by some regions and not others
// (each failure is printed); repeat it once they answer.
const exitACLPartial = 1

func newACLCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "acl",
		Short: "Manage ACL tokens and policies (bootstrap, token, policy)",
		Long: `Manage ACL tokens and policies (Nomad's ACL system). A region started with
--acl refuses every call without a valid token (gRPC metadata
x-apiary-token; the CLI sends --token or $` + acl.EnvToken + `): a management
token may do everything, a client token what its policies grant (submit,
read, cancel per namespace; node read or write; operator), an agent token
only register its node in its region.

Through the global router, every write goes to every region with the same
accessor and secret, so a token works in every region; a token is made in
every region or none. Every command but bootstrap needs a management token.

Exit codes: 0 done, 1 some region did not take a write (each is named; repeat
it once they answer), 2 invalid input or refused (not allowed, not found),
3 the API is unavailable.`,
	}
	o.addFlags(cmd)
	token := &cobra.Command{Use: "token", Short: "Create, list, revoke ACL tokens; show the calling one"}
	token.AddCommand(newACLTokenCreateCmd(o), newACLTokenListCmd(o), newACLTokenRevokeCmd(o), newACLTokenSelfCmd(o))
	policy := &cobra.Command{Use: "policy", Short: "Apply, list, delete ACL policies"}
	policy.AddCommand(newACLPolicyApplyCmd(o), newACLPolicyListCmd(o), newACLPolicyDeleteCmd(o))
	cmd.AddCommand(newACLBootstrapCmd(o), token, policy)
	return cmd
}

// partial is the exit-1 error of a write some regions did not take.
func partial(what string, failed []string, again string) error {
	if len(failed) == 0 {
		return nil
	}
	return withCode(exitACLPartial, fmt.Errorf("%s: not every region took it: %s; %s", what, strings.Join(failed, "; "), again))
}

// printRegionsLine writes which regions took a write (none listed when the
// server is a region's coordinator, which answers for itself).
func printRegionsLine(w io.Writer, regions, failed []string) {
	if len(regions) > 0 {
		fmt.Fprintf(w, "Regions:\t%s\n", strings.Join(regions, ", "))
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "Failed:\t%s\n", strings.Join(failed, "; "))
	}
}

// ---------------------------------------------------------------------------
// acl bootstrap

func newACLBootstrapCmd(o *clientOpts) *cobra.Command {
	var accessor, secretFile string
	cmd := &cobra.Command{
		Use:   "bootstrap [FILE]",
		Short: "Create the first management token (once); prints its secret",
		Long: `Create the first management token of the federation (through the global
router: of every region, with the same ids) and print its accessor and secret
once: keep the secret, it is not shown again.

FILE, if given, holds the secret to bootstrap with (a UUID, as Nomad's
"acl bootstrap FILE"); --accessor the accessor id. When some region did not
take it (exit 1, each failure printed), run the same command again with the
same secret and --accessor once they answer: the regions that took it accept
the repeat. A region bootstrapped before with other ids refuses (exit 2).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &apiaryv1.BootstrapACLRequest{AccessorId: accessor}
			check := func() error {
				if accessor != "" {
					if err := acl.ValidateID("--accessor", accessor); err != nil {
						return withCode(exitInvalid, err)
					}
				}
				if err := checkSecretFile(secretFile); err != nil {
					return err
				}
				if len(args) == 0 {
					return nil
				}
				b, err := os.ReadFile(args[0])
				if err != nil {
					return withCode(exitInvalid, fmt.Errorf("the secret file to bootstrap with: %w", err))
				}
				secret := strings.TrimSpace(string(b))
				if err := acl.ValidateID("the secret file "+args[0], secret); err != nil {
					return withCode(exitInvalid, fmt.Errorf("%w: the file holds the secret to bootstrap with, alone", err))
				}
				req.SecretId = secret
				return nil
			}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewACLServiceClient, "",
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.BootstrapACLResponse, error) {
					return c.BootstrapACL(ctx, req)
				})
			if err != nil {
				return err
			}
			if err := writeSecretFile(secretFile, resp.GetToken()); err != nil {
				return err
			}
			if err := o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				t := newTable(w)
				printToken(t, resp.GetToken())
				printRegionsLine(t, resp.GetRegions(), resp.GetFailedRegions())
				t.Flush()
				fmt.Fprintf(cmd.ErrOrStderr(), "the secret is shown only now: keep it (export %s=%s)\n", acl.EnvToken, resp.GetToken().GetSecretId())
			}); err != nil {
				return err
			}
			return partial("acl bootstrap", resp.GetFailedRegions(), fmt.Sprintf(
				"once they answer, repeat it with the same ids: write the secret to a file and run `apiary acl bootstrap --accessor %s FILE`",
				resp.GetToken().GetAccessorId()))
		},
	}
	cmd.Flags().StringVar(&accessor, "accessor", "", "accessor id to bootstrap with (a UUID; default: a new one, or repeat a partial bootstrap's)")
	cmd.Flags().StringVar(&secretFile, "secret-file", "", secretFileHelp)
	return cmd
}

// printToken writes a token's fields as "Field:\tvalue" lines.
func printToken(w io.Writer, t *apiaryv1.ACLToken) {
	fmt.Fprintf(w, "Accessor ID:\t%s\n", t.GetAccessorId())
	if t.GetSecretId() != "" {
		fmt.Fprintf(w, "Secret ID:\t%s\n", t.GetSecretId())
	}
	fmt.Fprintf(w, "Name:\t%s\n", cell(t.GetName(), 0))
	fmt.Fprintf(w, "Type:\t%s\n", cell(t.GetType(), 0))
	if len(t.GetPolicies()) > 0 {
		fmt.Fprintf(w, "Policies:\t%s\n", strings.Join(t.GetPolicies(), ", "))
	}
	if t.GetType() == "agent" {
		fmt.Fprintf(w, "Region:\t%s\n", cell(t.GetRegion(), 0))
		node := t.GetNodeId()
		if node == "" {
			node = "(bound at its first registration)"
		}
		fmt.Fprintf(w, "Node:\t%s\n", node)
	}
	if t.GetCreateTimeMs() > 0 {
		fmt.Fprintf(w, "Created:\t%s\n", fmtTime(t.GetCreateTimeMs()))
	}
	fmt.Fprintf(w, "Expires:\t%s\n", expires(t))
}

func expires(t *apiaryv1.ACLToken) string {
	if t.GetExpirationTimeMs() <= 0 {
		return "never"
	}
	return time.UnixMilli(t.GetExpirationTimeMs()).Local().Format("2006-01-02 15:04:05")
}

// ---------------------------------------------------------------------------
// acl token create|list|revoke|self

func newACLTokenCreateCmd(o *clientOpts) *cobra.Command {
	var (
		name, typ, region, nodeID string
		secretFile                string
		policies                  []string
		ttl                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create --name N [--type client|management|agent] [--policy P]... [--region R] [--node-id ID] [--ttl 24h]",
		Short: "Create a token; prints its secret once",
		Long: `Create a token and print its accessor and secret once.

  client      (default) may do what its --policy policies grant
  management  may do everything
  agent       a join token: may register one node (--node-id, else the first
              that registers with it) in --region only; give it to the agent
              as --join-token-file or $APIARY_JOIN_TOKEN

Through the global router a client or management token is made in every
region, an agent token in its region; a token is made everywhere or nowhere
(a region that is down or refuses undoes it in the others).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			check := func() error {
				if strings.TrimSpace(name) == "" {
					return withCode(exitInvalid, errors.New("--name: is required (what the token is for, shown in lists)"))
				}
				switch typ {
				case "client", "management", "agent":
				default:
					return withCode(exitInvalid, fmt.Errorf("--type: must be client, management or agent, got %q", typ))
				}
				if typ != "client" && len(policies) > 0 {
					return withCode(exitInvalid, fmt.Errorf("--policy: only for client tokens (a %s token takes none)", typ))
				}
				if typ == "agent" && region == "" {
					return withCode(exitInvalid, errors.New("--region: required for an agent token (the region its node may join)"))
				}
				if typ != "agent" && (region != "" || nodeID != "") {
					return withCode(exitInvalid, errors.New("--region and --node-id: only for agent tokens"))
				}
				if ttl < 0 {
					return withCode(exitInvalid, fmt.Errorf("--ttl: must be >= 0 (0: never expires), got %s", ttl))
				}
				return checkSecretFile(secretFile)
			}
			req := &apiaryv1.CreateACLTokenRequest{Name: name, Type: typ, Policies: policies, Region: region, NodeId: nodeID,
				TtlMs: ttlMillis(ttl)}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewACLServiceClient, "",
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.CreateACLTokenResponse, error) {
					return c.CreateACLToken(ctx, req)
				})
			if err != nil {
				return err
			}
			if err := writeSecretFile(secretFile, resp.GetToken()); err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				t := newTable(w)
				printToken(t, resp.GetToken())
				printRegionsLine(t, resp.GetRegions(), nil)
				t.Flush()
				fmt.Fprintln(cmd.ErrOrStderr(), "the secret is shown only now: keep it")
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "what the token is for (required)")
	f.StringVar(&typ, "type", "client", "client, management or agent")
	f.StringArrayVar(&policies, "policy", nil, "policy a client token holds (repeatable)")
	f.StringVar(&region, "region", "", "agent tokens: the region the node may join (required)")
	f.StringVar(&nodeID, "node-id", "", "agent tokens: bind to this node id now (default: the first node that registers with it)")
	f.DurationVar(&ttl, "ttl", 0, "the token expires this long after it is made, rounded up to whole milliseconds (0: never)")
	f.StringVar(&secretFile, "secret-file", "", secretFileHelp)
	return cmd
}

// ttlMillis is a --ttl in whole milliseconds, rounded up: the request's
// ttl_ms is in ms and 0 there means "never expires", so a positive TTL
// below 1 ms (--ttl 1ns) must not be truncated to 0.
func ttlMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

func newACLTokenListCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List tokens (no secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewACLServiceClient, "",
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.ListACLTokensResponse, error) {
					return c.ListACLTokens(ctx, &apiaryv1.ListACLTokensRequest{})
				})
			if err != nil {
				return err
			}
			if u := resp.GetUnavailableRegions(); len(u) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: these regions did not answer, tokens only they hold are missing: %s\n", strings.Join(u, ", "))
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				t := newTable(w)
				fmt.Fprintln(t, "ACCESSOR\tNAME\tTYPE\tPOLICIES\tREGION\tNODE\tEXPIRES")
				for _, tok := range resp.GetTokens() {
					fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", tok.GetAccessorId(), cell(tok.GetName(), 40), tok.GetType(),
						cell(strings.Join(tok.GetPolicies(), ","), 60), cell(tok.GetRegion(), 0), cell(tok.GetNodeId(), 0), expires(tok))
				}
				t.Flush()
				if len(resp.GetTokens()) == 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "no tokens")
				}
			})
		},
	}
}

func newACLTokenRevokeCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ACCESSOR",
		Short: "Revoke a token everywhere; an agent token's node loses its epoch",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			check := func() error {
				if err := acl.ValidateID("ACCESSOR", id); err != nil {
					return withCode(exitInvalid, fmt.Errorf("%w: a token's accessor id, see `apiary acl token list`", err))
				}
				return nil
			}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewACLServiceClient, "token "+id,
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.RevokeACLTokenResponse, error) {
					return c.RevokeACLToken(ctx, &apiaryv1.RevokeACLTokenRequest{AccessorId: id})
				})
			if err != nil {
				return err
			}
			if err := o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				fmt.Fprintf(w, "token %s revoked", id)
				if r := resp.GetRegions(); len(r) > 0 {
					fmt.Fprintf(w, " in %s", strings.Join(r, ", "))
				}
				fmt.Fprintln(w)
				if n := resp.GetEndedNodeId(); n != "" {
					fmt.Fprintf(w, "node %s lost its epoch (its attempts run elsewhere)\n", n)
				}
			}); err != nil {
				return err
			}
			return partial("acl token revoke", resp.GetFailedRegions(), "repeat it once they answer")
		},
	}
}

func newACLTokenSelfCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "self",
		Short: "Show the token this CLI sends (--token or $" + acl.EnvToken + ")",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewACLServiceClient, "",
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.GetACLSelfResponse, error) {
					return c.GetACLSelf(ctx, &apiaryv1.GetACLSelfRequest{})
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				t := newTable(w)
				printToken(t, resp.GetToken())
				t.Flush()
			})
		},
	}
}

// ---------------------------------------------------------------------------
// acl policy apply|list|delete

func newACLPolicyApplyCmd(o *clientOpts) *cobra.Command {
	var description string
	cmd := &cobra.Command{
		Use:   "apply [--description D] NAME FILE",
		Short: "Create or replace a policy from a YAML file",
		Long: `Create or replace the policy NAME from the YAML file FILE (strict: an
unknown key is an error), e.g.

  namespaces:
    - name: a
      capabilities: [submit, read, cancel]
  node: read        # "", read or write
  operator: false

A client token holds the union of its policies' grants.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var pol *apiaryv1.ACLPolicy
			check := func() error {
				b, err := os.ReadFile(args[1])
				if err != nil {
					return withCode(exitInvalid, fmt.Errorf("the policy file: %w", err))
				}
				if pol, err = acl.ParsePolicyYAML(args[0], b); err != nil {
					return withCode(exitInvalid, fmt.Errorf("%s is not a valid policy (nothing was sent): %w", args[1], err))
				}
				if cmd.Flags().Changed("description") {
					pol.Description = description
				}
				return nil
			}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewACLServiceClient, "",
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.ApplyACLPolicyResponse, error) {
					return c.ApplyACLPolicy(ctx, &apiaryv1.ApplyACLPolicyRequest{Policy: pol})
				})
			if err != nil {
				return err
			}
			if err := o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				fmt.Fprintf(w, "policy %s applied", args[0])
				if r := resp.GetRegions(); len(r) > 0 {
					fmt.Fprintf(w, " in %s", strings.Join(r, ", "))
				}
				fmt.Fprintln(w)
			}); err != nil {
				return err
			}
			return partial("acl policy apply", resp.GetFailedRegions(), "apply it again once they answer")
		},
	}
	cmd.Flags().StringVar(&description, "description", "", "the policy's description (overrides the file's)")
	return cmd
}

func newACLPolicyListCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List policies and what they grant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewACLServiceClient, "",
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.ListACLPoliciesResponse, error) {
					return c.ListACLPolicies(ctx, &apiaryv1.ListACLPoliciesRequest{})
				})
			if err != nil {
				return err
			}
			if u := resp.GetUnavailableRegions(); len(u) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: these regions did not answer, policies only they hold are missing: %s\n", strings.Join(u, ", "))
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				t := newTable(w)
				fmt.Fprintln(t, "NAME\tNAMESPACES\tNODE\tOPERATOR\tDESCRIPTION")
				for _, p := range resp.GetPolicies() {
					var ns []string
					for _, r := range p.GetNamespaces() {
						ns = append(ns, r.GetName()+":"+strings.Join(r.GetCapabilities(), "+"))
					}
					fmt.Fprintf(t, "%s\t%s\t%s\t%t\t%s\n", p.GetName(), cell(strings.Join(ns, " "), 80), cell(p.GetNode(), 0),
						p.GetOperator(), cell(p.GetDescription(), 60))
				}
				t.Flush()
				if len(resp.GetPolicies()) == 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "no policies")
				}
			})
		},
	}
}

func newACLPolicyDeleteCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a policy everywhere (tokens that hold it lose its grants)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewACLServiceClient, "policy "+name,
				func(ctx context.Context, c apiaryv1.ACLServiceClient) (*apiaryv1.DeleteACLPolicyResponse, error) {
					return c.DeleteACLPolicy(ctx, &apiaryv1.DeleteACLPolicyRequest{Name: name})
				})
			if err != nil {
				return err
			}
			if err := o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				fmt.Fprintf(w, "policy %s deleted", name)
				if r := resp.GetRegions(); len(r) > 0 {
					fmt.Fprintf(w, " in %s", strings.Join(r, ", "))
				}
				fmt.Fprintln(w)
			}); err != nil {
				return err
			}
			return partial("acl policy delete", resp.GetFailedRegions(), "delete it again once they answer")
		},
	}
}

const secretFileHelp = "also write the token's secret, alone, to this new file (mode 0600; an existing file is refused): " +
	"what --join-token-file and \"apiary acl bootstrap FILE\" read"

// checkSecretFile refuses a --secret-file that exists already or whose
// directory does not (before any call is made, exit 2).
func checkSecretFile(path string) error {
	if path == "" {
		return nil
	}
	if _, err := os.Lstat(path); err == nil {
		return withCode(exitInvalid, fmt.Errorf("--secret-file %s: exists already (a secret is never overwritten)", path))
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return withCode(exitInvalid, fmt.Errorf("--secret-file %s: its directory does not exist", path))
	}
	return nil
}

// writeSecretFile writes t's secret and a newline to path, mode 0600,
// failing if the file exists ("": nothing).
func writeSecretFile(path string, t *apiaryv1.ACLToken) error {
	if path == "" || t.GetSecretId() == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("--secret-file: %w (the token was made: its secret is printed below; accessor %s)", err, t.GetAccessorId())
	}
	if _, err := fmt.Fprintln(f, t.GetSecretId()); err != nil {
		f.Close()
		return fmt.Errorf("--secret-file: %w", err)
	}
	return f.Close()
}
