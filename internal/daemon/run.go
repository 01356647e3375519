// Package daemon is what `outbox-cdc run` does once its configuration is loaded: it wires the
// metrics endpoint, tracing, the sources and, in a fleet, the coordination, and streams until its
// context ends. One path serves both forms of the configuration: the one-source shorthand is a fleet
// of one source, which exits on a permanent error (ExitOnFailure) rather than hold it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/fleet"
	"github.com/outbox-cdc/outbox-cdc/internal/buildinfo"
	"github.com/outbox-cdc/outbox-cdc/internal/tracing"
	"github.com/outbox-cdc/outbox-cdc/metrics"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// ErrStopped is returned when the process stopped on an error it has logged.
var ErrStopped = errors.New("stopped on error (see the log above)")

// Options are run's choices beside the configuration.
type Options struct {
	// Sources are the sources this process streams: the configuration's (its sources list, or the
	// one-source shorthand), or those --source named.
	Sources []config.Config
	// Picked is true when --source named the sources: they run without the fleet's group.
	Picked bool
	// AcceptGap starts an exactly-once source whose slot stands ahead of its last checkpoint.
	AcceptGap bool
	// Scrub hides the configuration's secrets in text shown to people.
	Scrub func(string) string
}

// Run streams o.Sources of cfg until ctx ends, serving metrics, health and (with several sources or a
// group) the fleet API on metrics.addr. It returns nil after a graceful stop, ErrStopped after a
// failure it logged, and other errors for a configuration it refuses at start.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, o Options) error {
	if o.AcceptGap && len(o.Sources) > 1 {
		return fmt.Errorf("--accept-gap: name the one source it is for with --source (it accepts a gap in that source's events)")
	}
	m := metrics.New()
	var common []pipeline.Option
	tracer, stopTracing, err := tracing.Setup(ctx, cfg.Tracing, buildinfo.Read().Version)
	if err != nil {
		return err
	}
	defer func() {
		// Spans still batched go out before the process ends, within a few seconds.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("tracing: spans not exported at stop", "error", err.Error())
		}
	}()
	if tracer != nil {
		common = append(common, pipeline.WithTracer(tracer))
		log.Info("tracing: a producer span per record", "otlp_endpoint", cfg.Tracing.OTLPEndpoint, "sample_ratio", cfg.Tracing.SampleRatio)
	}
	if o.AcceptGap {
		common = append(common, pipeline.WithAcceptGap())
	}
	one := !cfg.HasSources()
	if one {
		// The shorthand's errors read as they always have, without a source's name before them.
		if _, err := pipeline.New(o.Sources[0], log, common...); err != nil {
			return err
		}
	} else {
		// The sources' bytes in flight together, beside each one's limits: the process's bound.
		common = append(common, pipeline.WithBudget(router.NewBudget(cfg.Fleet.MaxInFlightBytes)))
	}
	var members []fleet.Source
	names := make([]string, 0, len(o.Sources))
	for _, s := range o.Sources {
		members = append(members, fleet.Source{Config: s, Options: append([]pipeline.Option{pipeline.WithObserver(m.Source(s.Name))}, common...)})
		names = append(names, s.Name)
	}
	var coord *fleet.Coordinator
	if !one && cfg.Fleet.Coordination == config.FleetKafka && !o.Picked {
		if coord, err = coordinator(cfg, log); err != nil {
			return err
		}
	}
	f, err := fleet.New(log, m, o.Scrub, coord, members)
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	if one {
		f.ExitOnFailure()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var extra map[string]http.Handler
	if !one {
		api := f.Handler(fleet.APIOptions{TokenFile: cfg.Metrics.AdminTokenFile, AllowedHosts: cfg.Metrics.AllowedHosts})
		extra = map[string]http.Handler{"/api/": api, "/status": api}
	}
	if err := serve(ctx, cfg, m, log, extra); err != nil {
		return err
	}
	info := buildinfo.Read()
	if one {
		s := o.Sources[0]
		log.Info("outbox-cdc starting", "version", info.Version, "commit", info.Commit, "postgres", s.PostgresTarget(),
			"brokers", s.Kafka.Brokers, "table", s.Postgres.Table, "slot", s.Postgres.Slot)
	} else {
		log.Info("outbox-cdc starting", "version", info.Version, "commit", info.Commit, "sources", names)
		for _, s := range o.Sources {
			log.Info("source", "source", s.Name, "postgres", s.PostgresTarget(), "brokers", s.Kafka.Brokers, "table", s.Postgres.Table,
				"slot", s.Postgres.Slot, "delivery", s.Kafka.Delivery)
		}
	}
	if err := f.Run(ctx); err != nil {
		if one {
			log.Error("outbox-cdc stopped: retrying cannot fix this; fix it and start again", "error", err.Error())
		} else {
			log.Error("outbox-cdc stopped", "error", err.Error())
		}
		return ErrStopped
	}
	return nil
}

// coordinator is the fleet's consumer-group coordination of cfg, with this instance's name.
func coordinator(cfg config.Config, log *slog.Logger) (*fleet.Coordinator, error) {
	kopts, err := router.ClientOpts(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	instance := cfg.Fleet.Instance
	if instance == "" {
		host, _ := os.Hostname()
		instance = host
		if cfg.Metrics.Addr != "" {
			instance += "/" + cfg.Metrics.Addr
		}
	}
	return &fleet.Coordinator{
		Group: cfg.GroupID(), Topic: cfg.CoordinationTopic(), LegacyTopic: cfg.LegacyCoordinationTopic(), Instance: instance,
		SessionTimeout: cfg.Fleet.SessionTimeout, RebalanceTimeout: cfg.ShutdownTimeout + 30*time.Second,
		ReplicationFactor: cfg.Kafka.TopicReplicationFactor, ClientOpts: kopts, Log: log,
	}, nil
}

// serve serves the metrics, health and extra handlers on metrics.addr (nothing when it is empty)
// until ctx ends.
func serve(ctx context.Context, cfg config.Config, m *metrics.Metrics, log *slog.Logger, extra map[string]http.Handler) error {
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
