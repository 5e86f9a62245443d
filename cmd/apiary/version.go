package main

// apiary version: which build this is (internal/buildinfo).

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/internal/buildinfo"
)

func init() { register(newVersionCmd) }

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Long: `Print the version (git describe at build time; "dev" for a build that
make did not stamp), the commit (from the build stamp, else from the Go
toolchain's VCS record) and the Go version and platform it was built with.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in := buildinfo.Get()
			switch output {
			case "text":
				fmt.Fprintln(cmd.OutOrStdout(), in.String())
			case "json":
				b, _ := json.Marshal(in)
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
			default:
				return withCode(exitInvalid, fmt.Errorf("--output must be text or json (got %q)", output))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}
