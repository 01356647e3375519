package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Preflight makes the checks run makes before it streams, with the same functions, and creates
// nothing in PostgreSQL: the routing rules, the streaming server's identity, set-up's checks of the
// table, the publication and the slot (generated and missing columns, inheritance children, a lost
// or interrupted slot, ...), and in exactly-once mode the checkpoint against the slot (a gap, a
// checkpoint missing or past the WAL). With createCheckpointTopic, the exactly-once mode's checkpoint
// topic is created when missing, as run creates it. It returns what run would only warn of, or the
// error run would stop with. A slot another instance streams from is no error.
func Preflight(ctx context.Context, cfg config.Config, log *slog.Logger, createCheckpointTopic bool) (warnings []string, err error) {
	p, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return nil, err
	}
	defer func() { _ = cat.Close(context.Background()) }()
	conn, srv, err := p.connect(ctx, cat)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	res, err := cat.Setup(ctx, replication.SetupOptions{
		Outbox: p.outbox(), Tables: p.tables(), Slot: cfg.Postgres.Slot, Columns: p.columnRoles(), FailoverSlot: cfg.Postgres.FailoverSlot, Server: srv,
		Ignore: replication.IgnoredTables(cfg.Postgres.IgnoreTables),
	})
	warnings = res.Warnings
	if errors.Is(err, replication.ErrSlotInUse) && res.Slot.Exists {
		warnings = append(warnings, fmt.Sprintf("slot %s is in use: %v", cfg.Postgres.Slot, err))
		err = nil
	}
	if err != nil || !cfg.Kafka.ExactlyOnce() {
		return warnings, err
	}
	p.slotID = &checkpoint.SlotID{SystemID: srv.SystemID, Database: srv.Database, Slot: cfg.Postgres.Slot}
	var last *checkpoint.Record
	var state string
	if createCheckpointTopic {
		rt, err := p.newRouter(ctx) // its Ping creates the checkpoint topic, as run's does
		if err != nil {
			return warnings, err
		}
		defer rt.Close()
		if state, err = rt.TransactionState(ctx); err != nil {
			return warnings, err
		}
		if last, err = rt.ReadCheckpoint(ctx); err != nil {
			return warnings, err
		}
	} else if last, err = router.ReadCheckpoint(ctx, cfg.Kafka, cfg.Kafka.CheckpointTopic, *p.slotID, p.log); err != nil {
		return warnings, err
	}
	if last == nil && state == "CompleteCommit" {
		return warnings, fmt.Errorf("%w: kafka.checkpoint_topic %s holds no checkpoint for slot %s, yet Kafka's transaction coordinator says its last Kafka transaction committed: "+
			"the topic was deleted, or its records expired (retention); run refuses to start (recover with outbox-cdc resync, or accept duplicates with run --accept-gap)",
			checkpoint.ErrMissing, cfg.Kafka.CheckpointTopic, p.slotID)
	}
	if last == nil {
		warnings = append(warnings, fmt.Sprintf("no checkpoint in %s for slot %s yet: run starts exactly-once delivery at the slot's position, %s", cfg.Kafka.CheckpointTopic, p.slotID, res.Slot.ConfirmedFlush))
		return warnings, nil
	}
	if _, err := checkpoint.Start(res.Slot.ConfirmedFlush, srv.Checkpoint(), last, false); err != nil {
		return warnings, fmt.Errorf("run refuses to start: %w", err)
	}
	return warnings, nil
}
