package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/buildinfo"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

func newResyncCommand() *cobra.Command {
	var (
		yes, snapshotOnly, dryRun bool
		since, until              string
		eventTypes, aggregateIDs  []string
		only                      []string
	)
	cmd := &cobra.Command{
		Use:   "resync",
		Short: "Recreate the slot with a snapshot, replay the outbox table's rows, then stream",
		Long: `resync recreates the replication slot with an exported snapshot, publishes the outbox rows
visible in that snapshot through the same router, dead-letter rules and acknowledgement tracking
as run, and then streams from the slot's consistent point exactly as run does. A row committed
before the slot was created comes from the snapshot, one committed after it from the WAL: none from
both, none from neither.

Use it to start on an outbox table that already holds rows, to recover after the slot was dropped or
lost (wal_status 'lost'), or to replay retained rows (a new consumer, a lost topic). Only rows still
in the table can be replayed: rows deleted in their own transaction are gone.

Snapshot rows are published per aggregate in the order the WAL had them, as far as the table tells:
aggregate_version, then the inserting transaction (its commit time with track_commit_timestamp, else
its id), created_at, the statement within it, and the physical position. Memory stays bounded for a
table of any size (a server-side cursor, and the in-flight caps).

An existing slot is dropped only with --yes or after a confirmation on a terminal. A slot held by a
running router stops resync. If resync is interrupted, run it again (not run): the rows of the
snapshot are published again, and consumers drop the duplicates by event_id.`,
		Example: `  # Count what a replay would publish, per topic, changing nothing:
  outbox-cdc resync --dry-run

  # Replay yesterday's OrderPaid events for one order, then keep streaming:
  outbox-cdc resync --yes --since 2026-12-01T00:00:00Z --until 2026-12-02T00:00:00Z \
      --event-type OrderPaid --aggregate-id 42

  # Recover a lost slot, publish the snapshot and stop; start the daemon with run afterwards:
  outbox-cdc resync --yes --snapshot-only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			all, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			picked, err := pickSources(all, only, true)
			if err != nil {
				return err
			}
			cfg := picked[0]
			opts := pipeline.ResyncOptions{
				Yes: yes, SnapshotOnly: snapshotOnly, DryRun: dryRun,
				EventTypes: eventTypes, AggregateIDs: aggregateIDs, Out: cmd.OutOrStdout(),
			}
			if opts.Since, err = parseTime("--since", since); err != nil {
				return err
			}
			if opts.Until, err = parseTime("--until", until); err != nil {
				return err
			}
			terminal := term.IsTerminal(int(os.Stdin.Fd())) && term.IsTerminal(int(os.Stderr.Fd()))
			if terminal {
				opts.Confirm = func(q string) bool {
					fmt.Fprintf(os.Stderr, "%s [y/N] ", q)
					answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
					return strings.EqualFold(strings.TrimSpace(answer), "y") || strings.EqualFold(strings.TrimSpace(answer), "yes")
				}
			}
			opts.Progress = progressReporter(terminal)
			log := newLogger(os.Stderr, cfg)
			applyMemoryLimit(log)
			p, err := pipeline.New(cfg, log)
			if err != nil {
				return err
			}
			log.Info("outbox-cdc resync", "version", buildinfo.Read().Version, "commit", buildinfo.Read().Commit, "postgres", cfg.PostgresTarget(),
				"table", cfg.Postgres.Table, "slot", cfg.Postgres.Slot, "dry_run", dryRun, "snapshot_only", snapshotOnly)
			res, err := p.Resync(cmd.Context(), opts)
			if err != nil {
				log.Error("resync stopped", "error", err.Error(), "snapshot_rows_published", res.Rows)
				return errExit
			}
			if !dryRun {
				fmt.Fprintf(cmd.OutOrStdout(), "resync: %d snapshot rows published; slot %s starts at %s\n", res.Rows, cfg.Postgres.Slot, res.ConsistentPoint)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&only, "source", nil, "with a sources list: the source to resync (required when there are several)")
	f.BoolVar(&yes, "yes", false, "drop and recreate an existing slot without asking")
	f.BoolVar(&snapshotOnly, "snapshot-only", false, "stop after the snapshot, leaving the slot for a later run")
	f.BoolVar(&dryRun, "dry-run", false, "print what would be published (count per topic) and change nothing")
	f.StringVar(&since, "since", "", "replay rows with created_at at or after this time (RFC 3339)")
	f.StringVar(&until, "until", "", "replay rows with created_at before this time (RFC 3339)")
	f.StringSliceVar(&eventTypes, "event-type", nil, "replay only these event types (repeatable)")
	f.StringSliceVar(&aggregateIDs, "aggregate-id", nil, "replay only these aggregates (repeatable)")
	config.RegisterFlags(f)
	return cmd
}

func parseTime(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s: want an RFC 3339 time such as 2026-12-01T00:00:00Z or a date, got %q", flag, v)
}
