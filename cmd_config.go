package main

import (
	"fmt"
	"time"

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
			var shown any = blankSASL(cfg)
			if cfg.HasSources() {
				// Each source whole, as run streams it: the top-level keys with the source's own over them.
				type source struct {
					Name     string          `yaml:"name"`
					Postgres config.Postgres `yaml:"postgres"`
					Kafka    config.Kafka    `yaml:"kafka"`
					Routing  config.Routing  `yaml:"routing"`
					Limits   config.Limits   `yaml:"limits"`
				}
				var list []source
				for _, s := range cfg.Sources() {
					s = blankSASL(s)
					list = append(list, source{s.Name, s.Postgres, s.Kafka, s.Routing, s.Limits})
				}
				shown = struct {
					Log             config.Log     `yaml:"log"`
					Metrics         config.Metrics `yaml:"metrics"`
					Tracing         config.Tracing `yaml:"tracing"`
					ShutdownTimeout time.Duration  `yaml:"shutdown_timeout"`
					Sources         []source       `yaml:"sources"`
				}{cfg.Log, cfg.Metrics, cfg.Tracing, cfg.ShutdownTimeout, list}
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

// blankSASL returns c with its SASL password masked.
func blankSASL(c config.Config) config.Config {
	if c.Kafka.SASL.Password != "" {
		c.Kafka.SASL.Password = redact.Mask
	}
	return c
}
