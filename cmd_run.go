package main

import (
	"errors"
	"os"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/daemon"
)

func newRunCommand() *cobra.Command {
	var acceptGap bool
	var only []string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Stream the outbox to Kafka until stopped",
		Long: `run streams committed inserts into the outbox table to Kafka until SIGINT or SIGTERM.

It creates the publication and the replication slot when they are missing (postgres.create_publication,
postgres.create_slot), and missing topics (kafka.create_topics). While another instance streams from
the slot it waits as a hot standby and takes over when the slot frees. Lost connections and final
Kafka errors are retried from the slot with exponential backoff; the slot never moves past a record
Kafka has not acknowledged. On SIGINT/SIGTERM it stops reading, waits up to shutdown_timeout for
in-flight acknowledgements, confirms them and exits 0.

With kafka.delivery=exactly-once (--delivery exactly-once) records are produced in Kafka transactions
that hold whole PostgreSQL transactions and a checkpoint record (kafka.checkpoint_topic); consumers
that read with isolation.level=read_committed see every event exactly once, through crashes and
takeovers. At start the last checkpoint is read back: transactions it holds are skipped, and a slot
that stands ahead of it (dropped and created anew, advanced by hand) is refused unless --accept-gap
is given.

With a sources list in the configuration file, one process streams sources: each on its own slot and
connections, independently; a source that fails for good is held with its error (on /readyz and in
the logs) and started again after a wait, while the others stream on. Metrics carry a source label;
/readyz?source=NAME answers for one source. Instances started with the same sources list share them
through a Kafka consumer group (fleet.coordination kafka, the default): each source is streamed by one
instance, spread evenly, and moves when its instance stops, dies (after fleet.session_timeout) or
another joins. --source NAME streams the named sources only, without the group.

Environment variables:
` + config.EnvReference(),
		Example: `  # Local services from "make up":
  outbox-cdc run --postgres postgres://outbox:outbox-dev-secret@127.0.0.1:55432/outbox --brokers 127.0.0.1:59092

  # Route every event of an aggregate type to one topic, with a dead-letter topic:
  outbox-cdc run --config outbox-cdc.yaml --topic 'outbox.{aggregate_type}' --dlq-topic outbox.dlq

  # Exactly-once for read_committed consumers:
  outbox-cdc run --config outbox-cdc.yaml --delivery exactly-once

  # Several sources (a sources list in the file), only two of them in this process:
  outbox-cdc run --config fleet.yaml --source orders,billing`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			log := newLogger(os.Stderr, cfg)
			applyMemoryLimit(log)
			sources, err := pickSources(cfg, only, false)
			if err != nil {
				return err
			}
			err = daemon.Run(cmd.Context(), cfg, log, daemon.Options{Sources: sources, Picked: len(only) > 0, AcceptGap: acceptGap, Scrub: scrubber(cfg).String})
			if errors.Is(err, daemon.ErrStopped) {
				return errExit
			}
			return err
		},
	}
	config.RegisterFlags(cmd.Flags())
	cmd.Flags().StringSliceVar(&only, "source", nil, "with a sources list: stream only these sources (repeat the flag or separate names by commas)")
	cmd.Flags().BoolVar(&acceptGap, "accept-gap", false, "exactly-once mode: start even though the slot stands ahead of the last checkpoint in Kafka (events between them may never have reached Kafka)")
	return cmd
}
