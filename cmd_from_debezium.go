package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/internal/redact"
	"github.com/outbox-cdc/outbox-cdc/ops"
)

func newFromDebeziumCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "from-debezium [connector.json|connector.properties|-]",
		Short: "Convert a Debezium outbox connector's configuration into outbox-cdc's",
		Long: `from-debezium reads the configuration of a Debezium PostgreSQL connector with the outbox
EventRouter — the JSON Kafka Connect's REST API takes or returns, or a .properties file; "-" or no
argument reads standard input — and prints the outbox-cdc configuration file that writes the same
records (kafka.header_format debezium) from the connector's own slot and publication, so that
outbox-cdc resumes where the connector stopped. What it cannot carry over is listed on standard
error, one line each; add kafka.brokers and the password (PGPASSWORD) yourself. It exits 1, naming
the key, when outbox-cdc cannot take over as configured, rather than write a configuration that
behaves otherwise: another decoding plugin, no outbox EventRouter, no table list or table patterns,
a route.topic.regex it cannot reproduce, or an EventRouter option it does not know (a typo
included). Several outbox tables become postgres.table and a tables list. It contacts nothing. See docs/debezium.md for the switch-over.`,
		Example: `  curl -s http://connect:8083/connectors/outbox | outbox-cdc from-debezium > outbox-cdc.yaml
  outbox-cdc from-debezium connector.properties > outbox-cdc.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if len(args) == 0 || args[0] == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(args[0])
			}
			if err != nil {
				return fmt.Errorf("read the connector's configuration: %w", err)
			}
			props, err := ops.ParseDebeziumConfig(data)
			if err != nil {
				return err
			}
			conv := ops.FromDebezium(props)
			// No value that may be a secret reaches the output, wherever the input put it.
			var secrets []string
			for k, v := range props {
				if ops.DebeziumSecretKey(k) {
					secrets = append(secrets, v)
				}
			}
			scrub := redact.NewScrubber(secrets...)
			for _, n := range conv.Notes {
				fmt.Fprintln(cmd.ErrOrStderr(), "from-debezium:", scrub.String(n))
			}
			if conv.Blocking {
				return errors.New("outbox-cdc cannot take over from this connector as configured (see above)")
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), scrub.String(string(conv.YAML)))
			return err
		},
	}
}
