package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/ops"
)

func newInitCommand() *cobra.Command {
	var (
		dryRun, createTable bool
		standbys            []string
		only                []string
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Check the database's prerequisites and create the table, publication, slot and topics",
		Long: `init checks what outbox-cdc needs and says exactly what is wrong and how to fix it:
wal_level = logical, room in max_replication_slots and max_wal_senders, the role's REPLICATION
attribute and its SELECT privilege on the outbox table.

It then creates, idempotently, what is missing: the outbox table (only with --create-table, from
sql/outbox.sql), the publication (publish = 'insert'), the replication slot, and the Kafka topics the
routing configuration names in advance (routing.topics, fallback and dead-letter topics). Running it
twice changes nothing the second time. --dry-run prints the SQL and the topics and changes nothing.

Finally it explains whether the slot will survive a failover: on PostgreSQL 17 and later the slot is
a failover slot; the primary's synchronized_standby_slots is checked, and each standby given with
--standby (or postgres.standby_urls) is checked for what slot synchronization needs. A standby whose
copy of a new slot is still temporary is explained, not an error: status exits 1 on it.`,
		Example: `  outbox-cdc init --dry-run
  outbox-cdc init --create-table --dlq-topic outbox.dlq
  outbox-cdc init --standby postgres://outbox:secret@standby-1:5432/outbox`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			sources, err := pickSources(cfg, only, false)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			out := scrubber(cfg).Writer(cmd.OutOrStdout())
			var failed []string
			for _, src := range sources {
				src.Postgres.StandbyURLs = append(src.Postgres.StandbyURLs, standbys...)
				if cfg.HasSources() {
					fmt.Fprintf(out, "== source %s\n", src.Name)
				}
				if err := ops.Init(ctx, out, src, ops.InitOptions{CreateTable: createTable, DryRun: dryRun}); err != nil {
					if !cfg.HasSources() {
						return errors.New(scrubber(cfg).String(err.Error()))
					}
					// One source's failure does not keep the others from being set up.
					fmt.Fprintf(out, "source %s: %s\n", src.Name, scrubber(cfg).String(err.Error()))
					failed = append(failed, src.Name)
				}
			}
			// What a least-privilege Kafka principal needs, whatever else init found.
			principal := "User:<principal>"
			if cfg.Kafka.SASL.Username != "" {
				principal = "User:" + cfg.Kafka.SASL.Username
			}
			ops.PrintACLs(out, cfg, principal)
			if len(failed) > 0 {
				return fmt.Errorf("init failed for source(s) %s (see above)", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&only, "source", nil, "with a sources list: set up only these sources")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the SQL and the topic list, change nothing")
	cmd.Flags().BoolVar(&createTable, "create-table", false, "create the outbox table from sql/outbox.sql when missing")
	cmd.Flags().StringArrayVar(&standbys, "standby", nil, "a standby's PostgreSQL URL whose readiness to take over the slot is checked and explained (repeatable; adds to postgres.standby_urls)")
	config.RegisterFlags(cmd.Flags())
	return cmd
}
