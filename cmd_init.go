package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/ops"
)

func newInitCommand() *cobra.Command {
	var dryRun, createTable bool
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Check the database's prerequisites and create the table, publication, slot and topics",
		Long: `init checks what outbox-cdc needs and says exactly what is wrong and how to fix it:
wal_level = logical, room in max_replication_slots and max_wal_senders, the role's REPLICATION
attribute and its SELECT privilege on the outbox table.

It then creates, idempotently, what is missing: the outbox table (only with --create-table, from
sql/outbox.sql), the publication (publish = 'insert'), the replication slot, and the Kafka topics the
routing configuration names in advance (routing.topics, fallback and dead-letter topics). Running it
twice changes nothing the second time. --dry-run prints the SQL and the topics and changes nothing.`,
		Example: `  outbox-cdc init --dry-run
  outbox-cdc init --create-table --dlq-topic outbox.dlq`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			if err := ops.Init(ctx, cmd.OutOrStdout(), cfg, ops.InitOptions{CreateTable: createTable, DryRun: dryRun}); err != nil {
				return errors.New(scrubber(cfg).String(err.Error()))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the SQL and the topic list, change nothing")
	cmd.Flags().BoolVar(&createTable, "create-table", false, "create the outbox table from sql/outbox.sql when missing")
	config.RegisterFlags(cmd.Flags())
	return cmd
}
