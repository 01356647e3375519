// Command readmodel is an example consuming service: it keeps a read model of orders (one row per
// order: how many events, the sum of their amounts, the last version) from the events outbox-cdc
// publishes, through package inbox, so that each event counts once however often it is delivered.
//
//	READMODEL_POSTGRES=postgres://app@localhost:5432/app \
//	READMODEL_BROKERS=localhost:9092 READMODEL_TOPICS=OrderPlaced,OrderPaid \
//	go run ./examples/readmodel
//
// Settings (environment): READMODEL_POSTGRES (required), READMODEL_BROKERS (required),
// READMODEL_TOPICS (comma-separated, required), READMODEL_GROUP (default readmodel, also the inbox's
// consumer name), READMODEL_DLQ_TOPIC (default readmodel.dlq; events that cannot be applied go there
// with the reason), READMODEL_METRICS_ADDR (default 127.0.0.1:9465; /metrics). It stops on SIGINT or
// SIGTERM, after the records in hand.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-cdc/outbox-cdc/examples/readmodel/readmodel"
	"github.com/outbox-cdc/outbox-cdc/inbox"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("readmodel stopped", "error", err.Error())
		os.Exit(1)
	}
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, log *slog.Logger) error {
	dbURL, brokers, topics := os.Getenv("READMODEL_POSTGRES"), os.Getenv("READMODEL_BROKERS"), os.Getenv("READMODEL_TOPICS")
	if dbURL == "" || brokers == "" || topics == "" {
		return errors.New("READMODEL_POSTGRES, READMODEL_BROKERS and READMODEL_TOPICS are required")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to READMODEL_POSTGRES: %w", err)
	}
	defer pool.Close()
	model := readmodel.Model{}
	if err := model.Setup(ctx, pool); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	group := env("READMODEL_GROUP", "readmodel")
	in, err := inbox.New(inbox.Options{
		Consumer: group, DB: pool, Handler: model.Apply,
		Brokers: strings.Split(brokers, ","), Topics: strings.Split(topics, ","), Group: group,
		DeadLetterTopic: env("READMODEL_DLQ_TOPIC", "readmodel.dlq"),
		Retention:       7 * 24 * time.Hour,
		Registerer:      reg, Logger: log,
	})
	if err != nil {
		return err
	}
	defer in.Close()
	if err := in.Setup(ctx); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Addr: env("READMODEL_METRICS_ADDR", "127.0.0.1:9465"), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server stopped", "error", err.Error())
		}
	}()
	defer func() { _ = srv.Close() }()
	log.Info("readmodel consuming", "topics", topics, "group", group)
	return in.Run(ctx)
}
