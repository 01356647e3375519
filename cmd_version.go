package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/internal/buildinfo"
)

func newVersionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, commit date, Go version and platform of this build",
		Long: `version prints which build of outbox-cdc this is: the release version (or Go's pseudo-version
of the commit, or "dev"), the commit it was built from (marked modified when the working tree had
changes), that commit's date, the Go version and the platform. The same is on /metrics as
outbox_cdc_build_info, and --version prints it on one line.`,
		Example: `  outbox-cdc version
  outbox-cdc version --json
  outbox-cdc --version`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := buildinfo.Read()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			}
			_, err := fmt.Fprint(cmd.OutOrStdout(), info.Lines())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
