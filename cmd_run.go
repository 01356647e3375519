package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/fleet"
	"github.com/outbox-cdc/outbox-cdc/internal/buildinfo"
	"github.com/outbox-cdc/outbox-cdc/internal/tracing"
	"github.com/outbox-cdc/outbox-cdc/metrics"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/router"
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
			if acceptGap && len(sources) > 1 {
				return fmt.Errorf("--accept-gap: name the one source it is for with --source (it accepts a gap in that source's events)")
			}
			m := metrics.New()
			var common []pipeline.Option
			tracer, stopTracing, err := tracing.Setup(cmd.Context(), cfg.Tracing, buildinfo.Read().Version)
			if err != nil {
				return err
			}
			defer func() {
				// Spans still batched go out before the process ends, within a few seconds.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := stopTracing(ctx); err != nil {
					log.Warn("tracing: spans not exported at stop", "error", err.Error())
				}
			}()
			if tracer != nil {
				common = append(common, pipeline.WithTracer(tracer))
				log.Info("tracing: a producer span per record", "otlp_endpoint", cfg.Tracing.OTLPEndpoint, "sample_ratio", cfg.Tracing.SampleRatio)
			}
			if acceptGap {
				common = append(common, pipeline.WithAcceptGap())
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			serve := func(extra map[string]http.Handler) error {
				if cfg.Metrics.Addr == "" {
					return nil
				}
				ln, err := net.Listen("tcp", cfg.Metrics.Addr)
				if err != nil {
					return fmt.Errorf("metrics.addr: %w", err)
				}
				paths := "/metrics /healthz /readyz"
				if extra != nil {
					paths += " /api/sources /status"
				}
				if cfg.Metrics.Pprof {
					paths += " /debug/pprof/"
				}
				log.Info("serving metrics and health", "addr", ln.Addr().String(), "paths", paths)
				go func() {
					if err := m.Serve(ctx, ln, cfg.Metrics.Pprof, extra); err != nil {
						log.Error("metrics endpoint stopped", "error", err.Error())
					}
				}()
				return nil
			}
			if !cfg.HasSources() {
				// The one-source shorthand: a permanent error ends the process, as it always has.
				opts := append([]pipeline.Option{pipeline.WithObserver(m.Source(config.DefaultSourceName))}, common...)
				p, err := pipeline.New(cfg, log, opts...)
				if err != nil {
					return err
				}
				m.Watch(config.DefaultSourceName, p.Health)
				if err := serve(nil); err != nil {
					return err
				}
				log.Info("outbox-cdc starting", "version", buildinfo.Read().Version, "commit", buildinfo.Read().Commit, "postgres", cfg.PostgresTarget(),
					"brokers", cfg.Kafka.Brokers, "table", cfg.Postgres.Table, "slot", cfg.Postgres.Slot)
				if err := p.Run(ctx); err != nil {
					log.Error("outbox-cdc stopped: retrying cannot fix this; fix it and start again", "error", err.Error())
					return errExit
				}
				return nil
			}
			var members []fleet.Source
			names := make([]string, 0, len(sources))
			// The sources' bytes in flight together, beside each one's limits: the process's bound.
			common = append(common, pipeline.WithBudget(router.NewBudget(cfg.Fleet.MaxInFlightBytes)))
			for _, s := range sources {
				members = append(members, fleet.Source{Config: s, Options: append([]pipeline.Option{pipeline.WithObserver(m.Source(s.Name))}, common...)})
				names = append(names, s.Name)
			}
			var coord *fleet.Coordinator
			if cfg.Fleet.Coordination == config.FleetKafka && len(only) == 0 {
				kopts, err := router.ClientOpts(cfg.Kafka)
				if err != nil {
					return err
				}
				instance := cfg.Fleet.Instance
				if instance == "" {
					host, _ := os.Hostname()
					instance = host
					if cfg.Metrics.Addr != "" {
						instance += "/" + cfg.Metrics.Addr
					}
				}
				coord = &fleet.Coordinator{
					Group: cfg.GroupID(), Topic: cfg.CoordinationTopic(), LegacyTopic: cfg.LegacyCoordinationTopic(), Instance: instance,
					SessionTimeout: cfg.Fleet.SessionTimeout, RebalanceTimeout: cfg.ShutdownTimeout + 30*time.Second,
					ReplicationFactor: cfg.Kafka.TopicReplicationFactor, ClientOpts: kopts, Log: log,
				}
			}
			f, err := fleet.New(log, m, scrubber(cfg).String, coord, members)
			if err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			api := f.Handler(fleet.APIOptions{TokenFile: cfg.Metrics.AdminTokenFile, AllowedHosts: cfg.Metrics.AllowedHosts})
			if err := serve(map[string]http.Handler{"/api/": api, "/status": api}); err != nil {
				return err
			}
			log.Info("outbox-cdc starting", "version", buildinfo.Read().Version, "commit", buildinfo.Read().Commit, "sources", names)
			for _, s := range sources {
				log.Info("source", "source", s.Name, "postgres", s.PostgresTarget(), "brokers", s.Kafka.Brokers, "table", s.Postgres.Table,
					"slot", s.Postgres.Slot, "delivery", s.Kafka.Delivery)
			}
			if err := f.Run(ctx); err != nil {
				log.Error("outbox-cdc stopped", "error", err.Error())
				return errExit
			}
			return nil
		},
	}
	config.RegisterFlags(cmd.Flags())
	cmd.Flags().StringSliceVar(&only, "source", nil, "with a sources list: stream only these sources (repeat the flag or separate names by commas)")
	cmd.Flags().BoolVar(&acceptGap, "accept-gap", false, "exactly-once mode: start even though the slot stands ahead of the last checkpoint in Kafka (events between them may never have reached Kafka)")
	return cmd
}
