package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Connect opens a replication connection (replication=database) to the database at url.
func Connect(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse postgres url: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox-cdc"
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres for replication: %w", err)
	}
	return conn, nil
}

// SplitTable splits "schema.table" (or "table", schema public) into its parts.
func SplitTable(qualified string) (schema, table string) {
	if i := strings.IndexByte(qualified, '.'); i >= 0 {
		return qualified[:i], qualified[i+1:]
	}
	return "public", qualified
}

// ErrNotSetUp is returned (wrapped) when the database lacks something outbox-cdc needs and may not or
// cannot create: the outbox table, a suitable publication, the slot. Retrying does not help.
var ErrNotSetUp = errors.New("database not set up for outbox-cdc")

// slotInfo is a row of pg_replication_slots.
type slotInfo struct {
	exists    bool
	plugin    string
	active    bool
	activePID int
	walStatus string
	confirmed LSN
}

func inspectSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (slotInfo, error) {
	rows, err := query(ctx, conn, fmt.Sprintf(
		`SELECT plugin, active, coalesce(active_pid, 0), coalesce(wal_status, ''), coalesce(confirmed_flush_lsn::text, '0/0')
		   FROM pg_replication_slots WHERE slot_name = %s AND database = current_database()`, quoteLiteral(slot)))
	if err != nil {
		return slotInfo{}, fmt.Errorf("inspect replication slot %q: %w", slot, err)
	}
	if len(rows) == 0 {
		return slotInfo{}, nil
	}
	r := rows[0]
	info := slotInfo{exists: true, plugin: r[0], active: r[1] == "t", walStatus: r[3]}
	fmt.Sscan(r[2], &info.activePID)
	lsn, err := pglogrepl.ParseLSN(r[4])
	if err != nil {
		return slotInfo{}, fmt.Errorf("parse confirmed_flush_lsn %q: %w", r[4], err)
	}
	info.confirmed = LSN(lsn)
	if info.plugin != "pgoutput" {
		return slotInfo{}, fmt.Errorf("replication slot %q uses plugin %q; outbox-cdc needs pgoutput", slot, info.plugin)
	}
	return info, nil
}

// SlotState is a replication slot as pg_replication_slots shows it.
type SlotState struct {
	// Exists is false when there is no such slot; the other fields are then zero.
	Exists bool
	// Active reports whether a walsender streams from it, and ActivePID which process.
	Active bool
	// ActivePID is the process streaming from it, 0 when inactive.
	ActivePID int
	// WALStatus is reserved, extended, unreserved or lost.
	WALStatus string
	// ConfirmedFlush is confirmed_flush_lsn.
	ConfirmedFlush LSN
}

// InspectSlot reads the slot's state.
func InspectSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (SlotState, error) {
	info, err := inspectSlot(ctx, conn, slot)
	if err != nil {
		return SlotState{}, err
	}
	return SlotState{Exists: info.exists, Active: info.active, ActivePID: info.activePID, WALStatus: info.walStatus, ConfirmedFlush: info.confirmed}, nil
}

// DropSlot drops the slot. It fails with SQLSTATE 55006 if a process streams from it.
func DropSlot(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	if err := pglogrepl.DropReplicationSlot(ctx, conn, quoteIdent(slot), pglogrepl.DropReplicationSlotOptions{}); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return fmt.Errorf("%w: drop slot %q: %s", ErrSlotInUse, slot, pgErr.Message)
		}
		return fmt.Errorf("drop replication slot %q: %w", slot, err)
	}
	return nil
}

// CreateSlotWithSnapshot creates the slot and exports a snapshot of the database exactly at the slot's
// consistent point. The snapshot can be imported (SET TRANSACTION SNAPSHOT) by another connection
// until conn runs its next command or closes.
func CreateSlotWithSnapshot(ctx context.Context, conn *pgconn.PgConn, slot string) (consistentPoint LSN, snapshot string, err error) {
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, quoteIdent(slot), "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return 0, "", fmt.Errorf("create replication slot %q with a snapshot: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, "", fmt.Errorf("parse consistent point %q: %w", res.ConsistentPoint, err)
	}
	return LSN(lsn), res.SnapshotName, nil
}

// ErrResyncInterrupted is returned (wrapped) when a resync of the slot started and did not finish
// publishing its snapshot: streaming now would skip the snapshot rows not yet published.
var ErrResyncInterrupted = errors.New("a resync of this slot was interrupted")

// ResyncMarker names the marker of an unfinished resync of slot: a physical slot that reserves no WAL,
// created before the snapshot and dropped once every snapshot row is acknowledged.
func ResyncMarker(slot string) string { return slot + "_resync" }

// CreateResyncMarker creates the marker of a resync of slot (idempotent).
func CreateResyncMarker(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	_, err := query(ctx, conn, fmt.Sprintf("SELECT pg_create_physical_replication_slot(%s, false)", quoteLiteral(ResyncMarker(slot))))
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") {
		return fmt.Errorf("create resync marker slot %q: %w", ResyncMarker(slot), err)
	}
	return nil
}

// DropResyncMarker drops the marker of a resync of slot, if it exists.
func DropResyncMarker(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	_, err := query(ctx, conn, fmt.Sprintf("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", quoteLiteral(ResyncMarker(slot))))
	if err != nil {
		return fmt.Errorf("drop resync marker slot %q: %w", ResyncMarker(slot), err)
	}
	return nil
}

// resyncMarkerExists reports whether a resync of slot is unfinished.
func resyncMarkerExists(ctx context.Context, conn *pgconn.PgConn, slot string) (bool, error) {
	rows, err := query(ctx, conn, fmt.Sprintf("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", quoteLiteral(ResyncMarker(slot))))
	if err != nil {
		return false, fmt.Errorf("look up resync marker: %w", err)
	}
	return len(rows) > 0, nil
}

// SetupOptions say what Setup may create.
type SetupOptions struct {
	// Slot, Publication, Schema and Table name the objects.
	Slot, Publication, Schema, Table string
	// CreatePublication and CreateSlot allow creating missing objects.
	CreatePublication, CreateSlot bool
	// SkipSlot leaves the slot alone (resync manages it).
	SkipSlot bool
}

// SetupResult says what Setup found and did.
type SetupResult struct {
	// CreatedPublication and CreatedSlot are true when Setup created them.
	CreatedPublication, CreatedSlot bool
}

// Setup checks that the outbox table, the publication (covering the table and publishing inserts)
// and the slot exist, creating the publication and slot when allowed.
func Setup(ctx context.Context, conn *pgconn.PgConn, o SetupOptions) (SetupResult, error) {
	var res SetupResult
	qualified := quoteIdent(o.Schema) + "." + quoteIdent(o.Table)
	rows, err := query(ctx, conn, fmt.Sprintf(
		`SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')`,
		quoteLiteral(o.Schema), quoteLiteral(o.Table)))
	if err != nil {
		return res, fmt.Errorf("look up outbox table: %w", err)
	}
	if len(rows) == 0 {
		return res, fmt.Errorf("%w: outbox table %s.%s does not exist (postgres.table); create it from sql/outbox.sql", ErrNotSetUp, o.Schema, o.Table)
	}

	rows, err = query(ctx, conn, fmt.Sprintf(`SELECT pubinsert FROM pg_publication WHERE pubname = %s`, quoteLiteral(o.Publication)))
	if err != nil {
		return res, fmt.Errorf("look up publication: %w", err)
	}
	switch {
	case len(rows) == 0 && !o.CreatePublication:
		return res, fmt.Errorf("%w: publication %q does not exist and postgres.create_publication is off: CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
			ErrNotSetUp, o.Publication, quoteIdent(o.Publication), qualified)
	case len(rows) == 0:
		if _, err := query(ctx, conn, fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`, quoteIdent(o.Publication), qualified)); err != nil {
			if isPrivilegeError(err) {
				return res, fmt.Errorf("%w: create publication %q: %w", ErrNotSetUp, o.Publication, err)
			}
			return res, fmt.Errorf("create publication %q: %w", o.Publication, err)
		}
		res.CreatedPublication = true
	case rows[0][0] != "t":
		return res, fmt.Errorf("%w: publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", ErrNotSetUp, o.Publication, quoteIdent(o.Publication))
	default:
		rows, err = query(ctx, conn, fmt.Sprintf(`SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s`,
			quoteLiteral(o.Publication), quoteLiteral(o.Schema), quoteLiteral(o.Table)))
		if err != nil {
			return res, fmt.Errorf("look up publication tables: %w", err)
		}
		if len(rows) == 0 {
			return res, fmt.Errorf("%w: publication %q does not include %s.%s: ALTER PUBLICATION %s ADD TABLE %s", ErrNotSetUp, o.Publication, o.Schema, o.Table, quoteIdent(o.Publication), qualified)
		}
	}

	if o.SkipSlot {
		return res, nil
	}
	slot, err := inspectSlot(ctx, conn, o.Slot)
	if err != nil {
		return res, err
	}
	if !slot.exists {
		if !o.CreateSlot {
			return res, fmt.Errorf("%w: replication slot %q does not exist and postgres.create_slot is off (create it with outbox-cdc resync)", ErrNotSetUp, o.Slot)
		}
		_, err := pglogrepl.CreateReplicationSlot(ctx, conn, quoteIdent(o.Slot), "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") { // 42710: created meanwhile by another instance
			if isPrivilegeError(err) {
				return res, fmt.Errorf("%w: create replication slot %q: %w", ErrNotSetUp, o.Slot, err)
			}
			return res, fmt.Errorf("create replication slot %q: %w", o.Slot, err)
		}
		res.CreatedSlot = err == nil
	}
	return res, nil
}

// isPrivilegeError reports SQLSTATE class 42 (syntax error or access rule violation).
func isPrivilegeError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42")
}

// query runs one statement in the simple protocol (the only one a replication connection speaks) and
// returns its rows as text.
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var out [][]string
	for _, r := range results {
		if r.Err != nil {
			return nil, r.Err
		}
		for _, row := range r.Rows {
			vals := make([]string, len(row))
			for i, v := range row {
				vals[i] = string(v)
			}
			out = append(out, vals)
		}
	}
	return out, nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
