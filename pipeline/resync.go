package pipeline

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

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

// snapshotFetchSize is how many rows one FETCH reads from the snapshot cursor.
const snapshotFetchSize = 1000

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
	cfg := p.cfg
	schema, table := replication.SplitTable(cfg.Postgres.Table)
	repl, err := replication.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return res, err
	}
	defer func() { _ = repl.Close(context.Background()) }()

	if o.DryRun {
		return p.dryRun(ctx, o, res)
	}
	if _, err := replication.Setup(ctx, repl, replication.SetupOptions{
		Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication, Schema: schema, Table: table,
		CreatePublication: cfg.Postgres.CreatePublication, SkipSlot: true,
	}); err != nil {
		return res, err
	}
	slot, err := replication.InspectSlot(ctx, repl, cfg.Postgres.Slot)
	if err != nil {
		return res, err
	}
	if slot.Exists {
		held := slotWALHeld(ctx, repl, cfg.Postgres.Slot)
		fmt.Fprintf(o.Out, "slot %s exists: active=%t wal_status=%s confirmed_flush_lsn=%s, holding %s of WAL\n",
			cfg.Postgres.Slot, slot.Active, orDash(slot.WALStatus), slot.ConfirmedFlush, held)
		if slot.Active {
			return res, fmt.Errorf("%w: slot %q is held by a running router (pid %d): stop it before resync", replication.ErrSlotInUse, cfg.Postgres.Slot, slot.ActivePID)
		}
		if !o.Yes {
			if o.Confirm == nil || !o.Confirm(fmt.Sprintf("Drop slot %s and replay the outbox table from a new snapshot?", cfg.Postgres.Slot)) {
				return res, fmt.Errorf("%w: slot %q exists; pass --yes to drop and recreate it", replication.ErrNotSetUp, cfg.Postgres.Slot)
			}
		}
	}
	// From here until every snapshot row is acknowledged, a marker says the slot's start is not
	// complete: run refuses to stream from it, so an interrupted resync cannot silently skip rows.
	if err := replication.CreateResyncMarker(ctx, repl, cfg.Postgres.Slot); err != nil {
		return res, err
	}
	if slot.Exists {
		if err := replication.DropSlot(ctx, repl, cfg.Postgres.Slot); err != nil {
			return res, err
		}
		p.log.Info("dropped replication slot for resync", "slot", cfg.Postgres.Slot)
	}
	cp, snapshot, err := replication.CreateSlotWithSnapshot(ctx, repl, cfg.Postgres.Slot)
	if err != nil {
		return res, err
	}
	res.ConsistentPoint = cp
	p.log.Info("created replication slot with snapshot", "slot", cfg.Postgres.Slot, "consistent_point", cp.String())

	db, err := pgconn.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return res, fmt.Errorf("connect for the snapshot: %w", err)
	}
	defer func() { _ = db.Close(context.Background()) }()
	if err := execAll(ctx, db, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
		"SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return res, fmt.Errorf("import the slot's snapshot: %w", err)
	}
	// The snapshot lives on in db's transaction; the exporting connection is no longer needed.
	_ = repl.Close(ctx)

	if err := p.publishSnapshot(ctx, db, o, cp, &res); err != nil {
		return res, err
	}
	if err := execAll(ctx, db, "COMMIT"); err != nil {
		return res, fmt.Errorf("end the snapshot transaction: %w", err)
	}
	if err := dropMarker(ctx, cfg.Postgres.URL, cfg.Postgres.Slot); err != nil {
		return res, err
	}
	p.log.Info("snapshot published", "rows", res.Rows, "consistent_point", cp.String())
	if o.SnapshotOnly {
		return res, nil
	}
	return res, p.Run(ctx)
}

// dropMarker removes the resync marker once the snapshot is fully acknowledged.
func dropMarker(ctx context.Context, url, slot string) error {
	conn, err := replication.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	return replication.DropResyncMarker(ctx, conn, slot)
}

// publishSnapshot reads the snapshot's rows with a cursor and delivers them; it returns once every
// one is acknowledged.
func (p *Pipeline) publishSnapshot(ctx context.Context, db *pgconn.PgConn, o ResyncOptions, cp checkpoint.LSN, res *ResyncResult) error {
	where, order := p.snapshotQuery(o)
	total, err := countRows(ctx, db, p.cfg.Postgres.Table, where)
	if err != nil {
		return err
	}
	rt, err := p.newRouter(ctx)
	if err != nil {
		return err
	}
	defer rt.Close()
	tracker := checkpoint.NewTracker(0)
	tx := tracker.Begin(time.Now())
	if err := execAll(ctx, db, fmt.Sprintf("DECLARE outbox_cdc_snapshot NO SCROLL CURSOR FOR SELECT * FROM %s%s%s",
		quoteTable(p.cfg.Postgres.Table), where, order)); err != nil {
		return fmt.Errorf("open snapshot cursor: %w", err)
	}
	src := router.Source{LSN: "snapshot@" + cp.String()}
	var sent int64
	lastProgress := time.Time{}
	report := func(force bool) {
		if o.Progress != nil && (force || time.Since(lastProgress) > 200*time.Millisecond) {
			acked := sent - int64(tracker.Stats().PendingRecords)
			o.Progress(acked, total)
			lastProgress = time.Now()
		}
	}
	err = forEachRow(ctx, db, func(row *replication.Row) error {
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
		rt.Produce(prepared, func() { tracker.Ack(tx) })
		sent++
		res.Rows++
		report(false)
		return nil
	})
	if err != nil {
		return err
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

// snapshotQuery returns the WHERE clause of the filters and the ORDER BY that keeps per-aggregate
// order for rows written by serialized transactions: created_at (the inserting transaction's start),
// then aggregate_version, then the physical position (insertion order within one transaction).
func (p *Pipeline) snapshotQuery(o ResyncOptions) (where, order string) {
	cols := p.cfg.Postgres.Columns
	var conds []string
	if !o.Since.IsZero() && cols.CreatedAt != "" {
		conds = append(conds, fmt.Sprintf("%s >= %s::timestamptz", quoteIdent(cols.CreatedAt), quoteLiteral(o.Since.Format(time.RFC3339Nano))))
	}
	if !o.Until.IsZero() && cols.CreatedAt != "" {
		conds = append(conds, fmt.Sprintf("%s < %s::timestamptz", quoteIdent(cols.CreatedAt), quoteLiteral(o.Until.Format(time.RFC3339Nano))))
	}
	in := func(col string, vals []string) string {
		q := make([]string, len(vals))
		for i, v := range vals {
			q[i] = quoteLiteral(v)
		}
		return fmt.Sprintf("%s IN (%s)", quoteIdent(col), strings.Join(q, ", "))
	}
	if len(o.EventTypes) > 0 {
		conds = append(conds, in(cols.EventType, o.EventTypes))
	}
	if len(o.AggregateIDs) > 0 {
		conds = append(conds, in(cols.AggregateID, o.AggregateIDs))
	}
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	var keys []string
	if cols.CreatedAt != "" {
		keys = append(keys, quoteIdent(cols.CreatedAt))
	}
	if cols.AggregateVersion != "" {
		keys = append(keys, quoteIdent(cols.AggregateVersion))
	}
	keys = append(keys, "ctid")
	return where, " ORDER BY " + strings.Join(keys, ", ")
}

// dryRun counts, in a repeatable-read snapshot of now, the rows a resync would publish per topic.
func (p *Pipeline) dryRun(ctx context.Context, o ResyncOptions, res ResyncResult) (ResyncResult, error) {
	db, err := pgconn.Connect(ctx, p.cfg.Postgres.URL)
	if err != nil {
		return res, fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = db.Close(context.Background()) }()
	where, _ := p.snapshotQuery(o)
	if err := execAll(ctx, db, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
		fmt.Sprintf("DECLARE outbox_cdc_snapshot NO SCROLL CURSOR FOR SELECT * FROM %s%s", quoteTable(p.cfg.Postgres.Table), where)); err != nil {
		return res, fmt.Errorf("open snapshot cursor: %w", err)
	}
	reasons := map[string]int64{}
	err = forEachRow(ctx, db, func(row *replication.Row) error {
		topic, problem := router.Plan(p.rules, columns(p.cfg), row, p.cfg.Kafka.MaxMessageBytes)
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
	_ = execAll(ctx, db, "ROLLBACK")
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

// forEachRow fetches the rows of the open cursor outbox_cdc_snapshot in batches (memory stays
// bounded whatever the table's size), decodes them as WAL rows are decoded, and calls fn for each.
func forEachRow(ctx context.Context, db *pgconn.PgConn, fn func(*replication.Row) error) error {
	decoder := replication.NewRowDecoder()
	for {
		results, err := db.Exec(ctx, fmt.Sprintf("FETCH FORWARD %d FROM outbox_cdc_snapshot", snapshotFetchSize)).ReadAll()
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
		r := results[0]
		if len(r.Rows) == 0 {
			return nil
		}
		names := make([]string, len(r.FieldDescriptions))
		oids := make([]uint32, len(r.FieldDescriptions))
		for i, fd := range r.FieldDescriptions {
			names[i], oids[i] = fd.Name, fd.DataTypeOID
		}
		for _, values := range r.Rows {
			row, err := decoder.Decode(names, oids, values)
			if err != nil {
				return fmt.Errorf("decode snapshot row: %w", err)
			}
			if err := fn(&row); err != nil {
				return err
			}
		}
	}
}

func countRows(ctx context.Context, db *pgconn.PgConn, table, where string) (int64, error) {
	results, err := db.Exec(ctx, fmt.Sprintf("SELECT count(*) FROM %s%s", quoteTable(table), where)).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("count snapshot rows: %w", err)
	}
	var n int64
	if len(results) > 0 && len(results[0].Rows) > 0 {
		_, _ = fmt.Sscan(string(results[0].Rows[0][0]), &n)
	}
	return n, nil
}

// slotWALHeld returns how much WAL the slot keeps (pg_current_wal_lsn() - restart_lsn), pretty-printed.
func slotWALHeld(ctx context.Context, conn *pgconn.PgConn, slot string) string {
	results, err := conn.Exec(ctx, fmt.Sprintf(`SELECT pg_size_pretty(pg_current_wal_lsn() - restart_lsn) FROM pg_replication_slots WHERE slot_name = %s`, quoteLiteral(slot))).ReadAll()
	if err != nil || len(results) == 0 || len(results[0].Rows) == 0 || results[0].Rows[0][0] == nil {
		return "an unknown amount"
	}
	return string(results[0].Rows[0][0])
}

func execAll(ctx context.Context, conn *pgconn.PgConn, stmts ...string) error {
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s).ReadAll(); err != nil {
			return err
		}
	}
	return nil
}

func quoteIdent(s string) string   { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

func quoteTable(qualified string) string {
	schema, table := replication.SplitTable(qualified)
	return quoteIdent(schema) + "." + quoteIdent(table)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
