package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/ops"
)

func newStatusCommand() *cobra.Command {
	var (
		asJSON      bool
		maxLag      int64
		maxInactive time.Duration
		standbys    []string
		only        []string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Report the slot, publication, outbox table and Kafka; exit non-zero when unhealthy",
		Long: `status reports the replication slot (exists, active and by which pid, wal_status, confirmed and
restart positions, WAL held, lag behind pg_current_wal_lsn()), the publication and its tables, the
outbox table's row estimate and oldest row, and whether Kafka answers and the topics the routing
configuration names in advance exist.

It also reports whether the slot survives a failover of the primary: the primary's
synchronized_standby_slots, and for each standby given with --standby (or postgres.standby_urls)
whether it is ready to take the slot over (PostgreSQL 17+: sync_replication_slots,
hot_standby_feedback, primary_slot_name with its physical slot on the primary and named in
synchronized_standby_slots, dbname in primary_conninfo, the slot synced and no longer temporary) and
how far its copy trails.

It exits 1 when unhealthy — slot missing, lost, inactive longer than --max-inactive (PostgreSQL 17
records since when; on older servers an inactive slot is unhealthy at once), lag over --max-lag-bytes,
Kafka unreachable, synchronized_standby_slots naming a slot this server lacks (logical decoding would
wait forever), a configured standby not ready — so it can drive an alert or a readiness probe.`,
		Example: `  outbox-cdc status
  outbox-cdc status --json | jq .slot.lag_bytes
  outbox-cdc status --max-lag-bytes 500000000 || page-the-on-call
  outbox-cdc status --standby postgres://outbox:secret@standby-1:5432/outbox`,
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
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			var all []ops.SourceStatus
			healthy := true
			for _, src := range sources {
				src.Postgres.StandbyURLs = append(src.Postgres.StandbyURLs, standbys...)
				st := ops.GatherStatus(ctx, src)
				st.Evaluate(ops.Thresholds{MaxLagBytes: maxLag, MaxInactive: maxInactive})
				st.Scrub(scrubber(cfg).String)
				healthy = healthy && st.Healthy
				all = append(all, ops.SourceStatus{Name: src.Name, Status: st})
			}
			if err := ops.WriteStatuses(cmd.OutOrStdout(), all, cfg.HasSources(), asJSON); err != nil {
				return err
			}
			if !healthy {
				return errUnhealthy
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	cmd.Flags().StringSliceVar(&only, "source", nil, "with a sources list: report only these sources")
	cmd.Flags().StringArrayVar(&standbys, "standby", nil, "a standby's PostgreSQL URL whose readiness to take over the slot is checked (repeatable; adds to postgres.standby_urls)")
	cmd.Flags().Int64Var(&maxLag, "max-lag-bytes", 1<<30, "unhealthy when the slot lags pg_current_wal_lsn() by more")
	cmd.Flags().DurationVar(&maxInactive, "max-inactive", 5*time.Minute, "unhealthy when the slot has been inactive longer (PostgreSQL 17+)")
	config.RegisterFlags(cmd.Flags())
	return cmd
}

// errUnhealthy makes status exit 1; the report says why.
var errUnhealthy = errors.New("unhealthy")
