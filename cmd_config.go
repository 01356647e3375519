package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/redact"
)

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Validate the configuration and print it as run would use it, secrets hidden",
		Long: `config loads the configuration exactly as run does — the YAML file (--config), then OUTBOX_CDC_*
environment variables, then flags — validates it, and prints the result as YAML, with every password
hidden. It exits 1, naming each key at fault, when the configuration is invalid; it contacts neither
PostgreSQL nor Kafka.`,
		Example: `  outbox-cdc config --config outbox-cdc.yaml
  OUTBOX_CDC_DELIVERY=exactly-once outbox-cdc config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			// The scrubber hides every secret wherever it appears; the SASL password is blanked
			// beforehand as well, so that YAML's quoting of an odd password cannot hide it from it.
			shown := cfg
			if shown.Kafka.SASL.Password != "" {
				shown.Kafka.SASL.Password = redact.Mask
			}
			out, err := yaml.Marshal(shown)
			if err != nil {
				return fmt.Errorf("print the configuration: %w", err)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), scrubber(cfg).String(string(out)))
			return err
		},
	}
	config.RegisterFlags(cmd.Flags())
	return cmd
}
