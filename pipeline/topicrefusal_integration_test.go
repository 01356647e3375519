package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestTopicSettingTheClusterRefusesStops: a topic setting the broker refuses (INVALID_CONFIG) cannot
// be fixed by a retry: the first row for a new topic stops the pipeline with ErrConfig naming
// kafka.topic_config, before anything past it is confirmed, instead of replaying for ever.
func TestTopicSettingTheClusterRefusesStops(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testConfig(f)
	cfg.Kafka.TopicConfig = map[string]string{"cleanup.policy": "sometimes"}
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	testenv.WaitFor(t, time.Minute, "streaming", func() bool { return p.State() == StateStreaming })
	var walBefore string
	if err := f.DB.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&walBefore); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{testenv.NewGenerator(1, "Refused").Event(0)}, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, router.ErrConfig) || !strings.Contains(err.Error(), "kafka.topic_config") {
			t.Fatalf("run: %v, want ErrConfig naming kafka.topic_config", err)
		}
	case <-ctx.Done():
		t.Fatal("the pipeline kept retrying a topic setting the broker refuses")
	}
	if after := f.ConfirmedFlushLSN(t); testenv.MustLSN(t, after) > testenv.MustLSN(t, walBefore) {
		t.Errorf("the slot moved to %s, past the row written after %s that was never delivered", after, walBefore)
	}
}
