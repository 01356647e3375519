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
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Report the slot, publication, outbox table and Kafka; exit non-zero when unhealthy",
		Long: `status reports the replication slot (exists, active and by which pid, wal_status, confirmed and
restart positions, WAL held, lag behind pg_current_wal_lsn()), the publication and its tables, the
outbox table's row estimate and oldest row, and whether Kafka answers and the topics the routing
configuration names in advance exist.

It exits 1 when unhealthy — slot missing, lost, inactive longer than --max-inactive (PostgreSQL 17
records since when; on older servers an inactive slot is unhealthy at once), lag over --max-lag-bytes,
Kafka unreachable — so it can drive an alert or a readiness probe.`,
		Example: `  outbox-cdc status
  outbox-cdc status --json | jq .slot.lag_bytes
  outbox-cdc status --max-lag-bytes 500000000 || page-the-on-call`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			st := ops.GatherStatus(ctx, cfg)
			st.Evaluate(ops.Thresholds{MaxLagBytes: maxLag, MaxInactive: maxInactive})
			st.Scrub(scrubber(cfg).String)
			if asJSON {
				if err := st.WriteJSON(cmd.OutOrStdout()); err != nil {
					return err
				}
			} else {
				st.Print(cmd.OutOrStdout())
			}
			if !st.Healthy {
				return errUnhealthy
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	cmd.Flags().Int64Var(&maxLag, "max-lag-bytes", 1<<30, "unhealthy when the slot lags pg_current_wal_lsn() by more")
	cmd.Flags().DurationVar(&maxInactive, "max-inactive", 5*time.Minute, "unhealthy when the slot has been inactive longer (PostgreSQL 17+)")
	config.RegisterFlags(cmd.Flags())
	return cmd
}

// errUnhealthy makes status exit 1; the report says why.
var errUnhealthy = errors.New("unhealthy")
