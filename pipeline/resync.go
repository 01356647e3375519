package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// ErrNothingToResync is returned (wrapped) by Resync for a source of WAL messages only: a message is
// in no table, so there is no snapshot to replay.
var ErrNothingToResync = errors.New("nothing to resync")

// ResyncOptions configure Resync.
type ResyncOptions struct {
	// Yes allows dropping an existing slot without asking.
	Yes bool
	// Confirm asks the operator (on a terminal); nil means nobody can be asked.
	Confirm func(question string) bool
	// SnapshotOnly stops after the snapshot, leaving the slot for a later run.
	SnapshotOnly bool
	// DryRun counts what would be published, per topic, and changes nothing.
	DryRun bool
	// Since and Until bound created_at (zero: unbounded; Until is exclusive).
	Since, Until time.Time
	// EventTypes and AggregateIDs, when not empty, select only those rows.
	EventTypes, AggregateIDs []string
	// Out receives the human-readable report (slot state, dry-run counts).
	Out io.Writer
	// Progress, if not nil, is called as snapshot rows are acknowledged (done of total).
	Progress func(done, total int64)
}

// ResyncResult says what the snapshot held.
type ResyncResult struct {
	// ConsistentPoint is the slot's start: rows committed before it came from the snapshot, rows
	// committed after it come from the WAL.
	ConsistentPoint checkpoint.LSN
	// Rows counts snapshot rows (published, or that would be in a dry run).
	Rows int64
	// PerTopic counts them per topic; undeliverable rows count under "(dead-letter)".
	PerTopic map[string]int64
}

// Resync (re)creates the slot with an exported snapshot, publishes the outbox rows visible in that
// snapshot through the same router, dead-letter rules and ack tracking as Run, then streams from the
// slot's consistent point exactly as Run does (unless SnapshotOnly or DryRun). A row committed before
// the slot's creation comes from the snapshot, one committed after it from the WAL: none from both,
// none from neither.
func (p *Pipeline) Resync(ctx context.Context, o ResyncOptions) (ResyncResult, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	res := ResyncResult{PerTopic: map[string]int64{}}
	if !p.outbox().HasTable() {
		return res, fmt.Errorf("%w: this source reads WAL messages only (postgres.message_prefixes, no postgres.table): a message is in no table, so there is nothing to snapshot and replay; "+
			"the slot keeps what was not delivered, and run delivers it", ErrNothingToResync)
	}
	if prefixes := p.cfg.Postgres.MessagePrefixes; len(prefixes) > 0 {
		// Said before anything changes: the new slot starts from now, and a message is in no table.
		fmt.Fprintf(o.Out, "note: events written as WAL messages (postgres.message_prefixes %s) are in no table: resync replays the tables' rows only, and messages the old slot had not delivered are not replayed\n", strings.Join(prefixes, ", "))
		p.log.Warn("resync replays the tables' rows only: events written as WAL messages are in no table", "message_prefixes", prefixes)
	}
	if o.DryRun {
		return p.dryRun(ctx, o, res)
	}
	if err := p.resyncSnapshot(ctx, o, &res); err != nil {
		return res, err
	}
	p.log.Info("snapshot published", "rows", res.Rows, "consistent_point", res.ConsistentPoint.String())
	if o.SnapshotOnly {
		return res, nil
	}
	return res, p.Run(ctx)
}

// resyncSnapshot recreates the slot and publishes its snapshot. It holds the slot's resync lock
// throughout, so that a router waits as a standby meanwhile and a second resync is refused.
func (p *Pipeline) resyncSnapshot(ctx context.Context, o ResyncOptions, res *ResyncResult) error {
	cfg := p.cfg
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return err
	}
	defer func() { _ = cat.Close(context.Background()) }()
	if err := cat.LockResync(ctx, cfg.Postgres.Slot); err != nil {
		return err
	}
	if _, err := cat.Setup(ctx, replication.SetupOptions{
		Outbox: p.outbox(), Tables: p.tables(), Slot: cfg.Postgres.Slot, Columns: p.columnRoles(),
		CreatePublication: cfg.Postgres.CreatePublication, SkipSlot: true, Ignore: replication.IgnoredTables(cfg.Postgres.IgnoreTables),
	}); err != nil {
		return err
	}
	// Before anything changes: a snapshot that could not read every row must not replace the slot.
	if err := p.checkReadable(ctx); err != nil {
		return err
	}
	slot, err := cat.Slot(ctx, cfg.Postgres.Slot)
	if err != nil {
		return err
	}
	if slot.Exists {
		fmt.Fprintf(o.Out, "slot %s exists: active=%t wal_status=%s confirmed_flush_lsn=%s, holding %.1f MB of WAL\n",
			cfg.Postgres.Slot, slot.Active, orDash(slot.WALStatus), slot.ConfirmedFlush, float64(slot.WALHeldBytes)/1e6)
		if slot.Active {
			return fmt.Errorf("%w: slot %q is held by a running router (pid %d): stop it before resync", replication.ErrSlotInUse, cfg.Postgres.Slot, slot.ActivePID)
		}
		if !o.Yes {
			if o.Confirm == nil || !o.Confirm(fmt.Sprintf("Drop slot %s and replay the outbox table from a new snapshot?", cfg.Postgres.Slot)) {
				return fmt.Errorf("%w: slot %q exists; pass --yes to drop and recreate it", replication.ErrNotSetUp, cfg.Postgres.Slot)
			}
		}
	}
	// From here until every snapshot row is acknowledged, a marker says the slot's start is not
	// complete: run refuses to stream from it, so an interrupted resync cannot silently skip rows.
	if err := cat.CreateResyncMarker(ctx, cfg.Postgres.Slot); err != nil {
		return err
	}
	if slot.Exists {
		if err := cat.DropSlot(ctx, cfg.Postgres.Slot); err != nil {
			// The old slot is intact: leave no marker behind, unless an earlier resync's was there.
			if !slot.ResyncMarker {
				if derr := cat.DropResyncMarker(context.Background(), cfg.Postgres.Slot); derr != nil {
					err = errors.Join(err, derr)
				}
			}
			return err
		}
		p.log.Info("dropped replication slot for resync", "slot", cfg.Postgres.Slot)
	}
	repl, err := replication.Connect(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return err
	}
	defer func() { _ = repl.Close(context.Background()) }()
	srv, err := replication.IdentifyServer(ctx, repl) // for the snapshot's checkpoint
	if err != nil {
		return err
	}
	cp, name, err := replication.CreateSlotWithSnapshot(ctx, repl, cfg.Postgres.Slot)
	if err != nil {
		return err
	}
	res.ConsistentPoint = cp
	p.log.Info("created replication slot with snapshot", "slot", cfg.Postgres.Slot, "consistent_point", cp.String())
	// Two connections share the exported snapshot: while the rows of one part of the table are
	// published from one, PostgreSQL sorts the next part on the other (replication.EachInParts).
	var snaps []*replication.Snapshot
	defer func() {
		for _, snap := range snaps {
			_ = snap.Close(context.Background())
		}
	}()
	for range snapshotConnections {
		snap, err := replication.OpenSnapshot(ctx, replication.TargetOf(cfg.Postgres), name)
		if err != nil {
			return err
		}
		snap.SetBatchBytes(snapshotBatchBytes(cfg.Limits.MaxInFlightBytes))
		snaps = append(snaps, snap)
	}
	// The snapshot lives on in snap's transaction: the exporting connection may run another command,
	// and is then no longer needed.
	if failover, err := cat.WantFailover(ctx, cfg.Postgres.FailoverSlot); err != nil {
		return err
	} else if failover {
		if err := replication.AlterSlotFailover(ctx, repl, cfg.Postgres.Slot); err != nil {
			p.log.Warn("could not make the slot a failover slot; it will not survive a promotion of a standby (postgres.failover_slot)", "slot", cfg.Postgres.Slot, "error", err.Error())
		}
	}
	_ = repl.Close(ctx)

	if err := p.publishSnapshot(ctx, snaps, o, cp, srv, res); err != nil {
		return err
	}
	return cat.DropResyncMarker(ctx, cfg.Postgres.Slot)
}

// checkReadable opens a snapshot connection and checks that it can read every outbox table's rows.
func (p *Pipeline) checkReadable(ctx context.Context) error {
	snap, err := replication.OpenSnapshot(ctx, replication.TargetOf(p.cfg.Postgres), "")
	if err != nil {
		return err
	}
	defer func() { _ = snap.Close(context.Background()) }()
	return snap.CheckReadable(ctx, p.allTables()...)
}

// snapshotColumns are the columns a snapshot is filtered and ordered by.
func (p *Pipeline) snapshotColumns() replication.SnapshotColumns {
	c := p.cfg.Postgres.Columns
	cols := replication.SnapshotColumns{EventType: c.EventType, AggregateID: c.AggregateID, AggregateVersion: c.AggregateVersion, CreatedAt: c.CreatedAt}
	for _, r := range p.columnRoles() {
		cols.Read = append(cols.Read, r.Column)
	}
	return cols
}

func (o ResyncOptions) filter() replication.SnapshotFilter {
	return replication.SnapshotFilter{Since: o.Since, Until: o.Until, EventTypes: o.EventTypes, AggregateIDs: o.AggregateIDs}
}

// publishSnapshot reads the snapshot's rows and delivers them; it returns once every one is
// acknowledged.
func (p *Pipeline) publishSnapshot(ctx context.Context, snaps []*replication.Snapshot, o ResyncOptions, cp checkpoint.LSN, srv replication.Server, res *ResyncResult) error {
	var total int64
	var counts []int64
	for _, t := range p.allTables() {
		n, err := snaps[0].Count(ctx, t, p.snapshotColumns(), o.filter())
		if err != nil {
			return err
		}
		counts = append(counts, n)
		total += n
	}
	if err := p.identify(ctx); err != nil {
		return err
	}
	if err := p.identifyAgain(srv); err != nil {
		return err
	}
	rt, err := p.newRouter(ctx)
	if err != nil {
		return err
	}
	defer rt.Close()
	eos := p.cfg.Kafka.ExactlyOnce()
	if eos {
		// The slot is new and ours (the resync lock is held): fence any instance still writing.
		if err := rt.Fence(ctx); err != nil {
			return err
		}
	}
	inTxn := 0
	tracker := checkpoint.NewTracker(0)
	tx := tracker.Begin(time.Now(), cp)
	src := router.Source{LSN: uint64(cp), Snapshot: true}
	var sent int64
	lastProgress := time.Time{}
	report := func(force bool) {
		if o.Progress != nil && (force || time.Since(lastProgress) > 200*time.Millisecond) {
			acked := sent - int64(tracker.Stats().PendingRecords)
			o.Progress(acked, total)
			lastProgress = time.Now()
		}
	}
	ack := func() { tracker.Ack(tx) } // every snapshot row is in tx: one callback for all of them
	err = p.eachSnapshotRow(ctx, snaps, o, counts, func(row *replication.Row) error {
		prepared, err := rt.Prepare(ctx, row, src)
		if err != nil {
			return err
		}
		topic := prepared.Topic()
		if topic == "" {
			topic = "(dead-letter)"
		}
		res.PerTopic[topic]++
		tracker.Add(tx)
		rt.Produce(prepared, ack)
		sent++
		res.Rows++
		report(false)
		if inTxn++; eos && inTxn >= p.cfg.Kafka.TransactionMaxRecords {
			// Snapshot rows in Kafka transactions of kafka.transaction_max_records; only the last
			// one carries the checkpoint. A resync killed halfway leaves its marker, and the rerun
			// publishes the snapshot again: rows committed before the kill are then in Kafka twice.
			inTxn = 0
			return rt.Commit(ctx, checkpoint.Record{})
		}
		return nil
	})
	if err != nil {
		if eos {
			rt.Abort()
		}
		return err
	}
	if eos {
		// The last snapshot transaction ends with a checkpoint at the slot's consistent point, where
		// run resumes: the slot is then not ahead of the checkpoint.
		if err := rt.Commit(ctx, checkpoint.Record{LSN: cp, Records: int(sent), Timeline: srv.Timeline, TimelineStart: srv.TimelineStart()}); err != nil {
			return fmt.Errorf("publish snapshot: %w", err)
		}
	}
	tracker.Commit(tx, cp)
	for tracker.Watermark() < cp {
		if err := rt.Err(); err != nil {
			return fmt.Errorf("publish snapshot: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		report(false)
		time.Sleep(10 * time.Millisecond)
	}
	report(true)
	return nil
}

// snapshotConnections is how many connections a resync reads its snapshot on.
const snapshotConnections = 2

// rowsPerPart is about how many rows of a table one part of a resync holds (snapshotParts).
const rowsPerPart = 500_000

// snapshotParts is how many parts a table of n rows is read in: one per per rows (rowsPerPart unless
// a test sets Pipeline.rowsPerPart), at most 8.
// PostgreSQL sorts each part on its own, the next one while the one before is published, so the
// first rows go out after the sort of one part rather than of the whole table; each part costs a
// scan of the table.
func snapshotParts(n, per int64) int {
	return int(min(max((n+per-1)/per, 1), 8))
}

// eachSnapshotRow calls fn for every row of the snapshot that o selects, one outbox table after the
// other (each row's Table set). counts, when not nil, are the tables' row counts: a large table is
// read in parts over every connection of snaps (replication.EachInParts).
func (p *Pipeline) eachSnapshotRow(ctx context.Context, snaps []*replication.Snapshot, o ResyncOptions, counts []int64, fn func(*replication.Row) error) error {
	for i, t := range p.allTables() {
		parts := 1
		if i < len(counts) {
			per := p.rowsPerPart
			if per <= 0 {
				per = rowsPerPart
			}
			parts = snapshotParts(counts[i], per)
		}
		err := replication.EachInParts(ctx, snaps, t, p.snapshotColumns(), o.filter(), parts, func(row *replication.Row) error {
			row.Table = i
			return fn(row)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// snapshotBatchBytes is the size of one snapshot FETCH: an eighth of limits.max_inflight_bytes, so
// that the three batches a resync holds while it reads ahead stay well within the records it may
// have in flight.
func snapshotBatchBytes(maxInFlight int64) int64 {
	return min(max(maxInFlight/8, 64<<10), replication.DefaultSnapshotBatchBytes)
}

// dryRun counts, in a repeatable-read snapshot of now, the rows a resync would publish per topic.
func (p *Pipeline) dryRun(ctx context.Context, o ResyncOptions, res ResyncResult) (ResyncResult, error) {
	snap, err := replication.OpenSnapshot(ctx, replication.TargetOf(p.cfg.Postgres), "")
	if err != nil {
		return res, err
	}
	defer func() { _ = snap.Close(context.Background()) }()
	snap.SetBatchBytes(snapshotBatchBytes(p.cfg.Limits.MaxInFlightBytes))
	reasons := map[string]int64{}
	err = p.eachSnapshotRow(ctx, []*replication.Snapshot{snap}, o, nil, func(row *replication.Row) error {
		topic, problem := router.Plan(p.rulesOf(row.Table), p.cfg.Postgres.Columns, p.format(), row, p.cfg.Kafka.MaxMessageBytes)
		if problem != nil {
			topic = "(dead-letter)"
			reasons[problem.Error()]++
		}
		res.PerTopic[topic]++
		res.Rows++
		return nil
	})
	if err != nil {
		return res, err
	}
	fmt.Fprintf(o.Out, "dry run: %d rows would be published; nothing was changed\n", res.Rows)
	topics := make([]string, 0, len(res.PerTopic))
	for t := range res.PerTopic {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	for _, t := range topics {
		fmt.Fprintf(o.Out, "  %-40s %d\n", t, res.PerTopic[t])
	}
	for reason, n := range reasons {
		dest := "to " + p.cfg.Routing.DLQTopic
		if p.cfg.Routing.DLQTopic == "" {
			dest = "would stop the router (no routing.dlq_topic)"
		}
		fmt.Fprintf(o.Out, "  dead-letter %s: %d rows: %s\n", dest, n, reason)
	}
	return res, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
