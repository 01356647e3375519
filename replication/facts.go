package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Prerequisites are the server's settings and the role's rights that decide whether outbox-cdc can
// work here, and which of its objects exist already.
type Prerequisites struct {
	// WALLevel is wal_level; MaxSlots and Slots are max_replication_slots and the slots in use;
	// MaxSenders and Senders are max_wal_senders and the WAL senders in use.
	WALLevel            string
	MaxSlots, Slots     int
	MaxSenders, Senders int
	// Replication is true when the role may stream (MayReplicateSQL).
	Replication bool
	// TableExists and CanSelect describe the outbox table and the role's SELECT on it.
	TableExists, CanSelect bool
	// PublicationExists and SlotExists describe outbox-cdc's publication and slot.
	PublicationExists, SlotExists bool
	// Platform is the managed service the server belongs to, told by its own roles and functions:
	// PlatformRDS, PlatformAurora, PlatformCloudSQL, PlatformAzure, or "" for a server of one's own.
	Platform string
}

// The managed PostgreSQL services init recognizes: each sets the server up its own way.
const (
	PlatformRDS      = "Amazon RDS"
	PlatformAurora   = "Amazon Aurora"
	PlatformCloudSQL = "Google Cloud SQL"
	PlatformAzure    = "Azure Database for PostgreSQL"
)

// platformSQL tells a managed service by what only it creates.
const platformSQL = `CASE
		WHEN EXISTS (SELECT FROM pg_proc WHERE proname = 'aurora_version') THEN 'Amazon Aurora'
		WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = 'rds_superuser') THEN 'Amazon RDS'
		WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = 'cloudsqlsuperuser') THEN 'Google Cloud SQL'
		WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = 'azure_pg_admin') THEN 'Azure Database for PostgreSQL'
		ELSE '' END`

// Prerequisites reads them for the outbox o and slot.
func (c *Catalog) Prerequisites(ctx context.Context, o Outbox, slot string) (Prerequisites, error) {
	var f Prerequisites
	var maxSlots, maxSenders string
	err := c.conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_replication_slots'), current_setting('max_wal_senders'),
		(SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication), `+MayReplicateSQL+`,
		EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1),
		EXISTS (SELECT FROM pg_publication WHERE pubname = $2), `+platformSQL, slot, o.Publication).
		Scan(&f.WALLevel, &maxSlots, &maxSenders, &f.Slots, &f.Senders, &f.Replication, &f.SlotExists, &f.PublicationExists, &f.Platform)
	if err != nil {
		return f, fmt.Errorf("read server settings: %w", err)
	}
	f.MaxSlots, _ = strconv.Atoi(maxSlots)
	f.MaxSenders, _ = strconv.Atoi(maxSenders)
	if !o.HasTable() {
		// WAL messages only: no table to find or read.
		f.TableExists, f.CanSelect = true, true
		return f, nil
	}
	var oid *uint32
	if err := c.conn.QueryRow(ctx, `SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		o.Schema, o.Table).Scan(&oid); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return f, fmt.Errorf("look up the outbox table: %w", err)
	}
	if oid != nil {
		f.TableExists = true
		if err := c.conn.QueryRow(ctx, `SELECT has_table_privilege($1::oid, 'SELECT')`, *oid).Scan(&f.CanSelect); err != nil {
			return f, fmt.Errorf("check SELECT on the outbox table: %w", err)
		}
	}
	return f, nil
}

// PublicationState is a publication as pg_publication and pg_publication_tables show it.
type PublicationState struct {
	// Name, Exists, PublishInsert and Tables (schema.table) describe it.
	Name          string   `json:"name"`
	Exists        bool     `json:"exists"`
	PublishInsert bool     `json:"publish_insert"`
	Tables        []string `json:"tables"`
}

// Publication reads the publication's state.
func (c *Catalog) Publication(ctx context.Context, name string) (PublicationState, error) {
	pub := PublicationState{Name: name}
	err := c.conn.QueryRow(ctx, `SELECT pubinsert FROM pg_publication WHERE pubname = $1`, name).Scan(&pub.PublishInsert)
	if errors.Is(err, pgx.ErrNoRows) {
		return pub, nil
	}
	if err != nil {
		return pub, fmt.Errorf("read pg_publication: %w", err)
	}
	pub.Exists = true
	rows, err := c.conn.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, name)
	if err != nil {
		return pub, fmt.Errorf("read pg_publication_tables: %w", err)
	}
	if pub.Tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return pub, fmt.Errorf("read pg_publication_tables: %w", err)
	}
	return pub, nil
}

// OutboxState is the outbox table's size and age.
type OutboxState struct {
	// Table is schema.table. RowEstimate is the row count: counted when below rowCountLimit, else
	// the planner's estimate (pg_class.reltuples, summed over partitions), at least rowCountLimit;
	// RowsAtLeast is then true. OldestAgeSeconds is now minus the oldest created-at; nil when the
	// table is empty, or the age could not be read in time.
	Table            string   `json:"table"`
	Exists           bool     `json:"exists"`
	RowEstimate      int64    `json:"row_estimate"`
	RowsAtLeast      bool     `json:"row_estimate_is_lower_bound,omitempty"`
	OldestAgeSeconds *float64 `json:"oldest_row_age_seconds"`
}

// rowCountLimit bounds the rows status counts: past it, it takes the planner's estimate.
const rowCountLimit = 10000

// OutboxState reads the outbox table's state; createdAt names its created-at column ("" skips the
// age). The age is read within a 5 s bound: applications that delete what they insert keep the table
// small, others may not.
func (c *Catalog) OutboxState(ctx context.Context, o Outbox, createdAt string) (OutboxState, error) {
	st := OutboxState{Table: o.String()}
	// The planner's estimate: -1 for a table never analyzed, none for a partitioned one (its
	// partitions have them).
	var estimate int64
	err := c.conn.QueryRow(ctx, `SELECT greatest(c.reltuples, 0)::bigint + coalesce((SELECT sum(greatest(p.reltuples, 0))::bigint FROM pg_partition_tree(c.oid) t
			JOIN pg_class p ON p.oid = t.relid WHERE t.relid <> c.oid), 0)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		o.Schema, o.Table).Scan(&estimate)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("look up the outbox table: %w", err)
	}
	st.Exists = true
	// A small table (the usual outbox) is counted, whatever the statistics say.
	err = c.conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT FROM `+o.qualified()+` LIMIT $1) t`, rowCountLimit).Scan(&st.RowEstimate)
	switch {
	case isPrivilegeError(err):
		st.RowEstimate = estimate // no SELECT on the table: the statistics have to do
	case err != nil:
		return st, fmt.Errorf("count the outbox's rows: %w", err)
	case st.RowEstimate >= rowCountLimit:
		st.RowEstimate, st.RowsAtLeast = max(estimate, rowCountLimit), true
	}
	if createdAt != "" {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var age *float64
		q := `SELECT extract(epoch FROM now() - min(` + pgx.Identifier{createdAt}.Sanitize() + `))::float8 FROM ` + o.qualified()
		if err := c.conn.QueryRow(qctx, q).Scan(&age); err == nil && age != nil {
			st.OldestAgeSeconds = age
		}
	}
	return st, nil
}

// CreateTable runs ddl, a CREATE TABLE statement for the outbox (sql/outbox.sql's, for the
// configured name).
func (c *Catalog) CreateTable(ctx context.Context, ddl string) error {
	if _, err := c.conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create the outbox table: %w", err)
	}
	return nil
}

// PublicationSQL is CreatePublicationSQL for this server.
func (c *Catalog) PublicationSQL(ctx context.Context, o Outbox, more ...Outbox) (string, error) {
	version, err := c.serverVersion(ctx)
	if err != nil {
		return "", err
	}
	return CreatePublicationSQL(o, version, more...), nil
}

// CreatePublication creates the outbox's publication (PublicationSQL). A missing privilege wraps
// ErrNotSetUp.
//
// more are further outbox tables the publication carries.
func (c *Catalog) CreatePublication(ctx context.Context, o Outbox, more ...Outbox) error {
	stmt, err := c.PublicationSQL(ctx, o, more...)
	if err != nil {
		return err
	}
	if _, err := c.conn.Exec(ctx, stmt); err != nil {
		if isPrivilegeError(err) {
			return fmt.Errorf("%w: %w: create publication %q: %w", ErrNotSetUp, ErrPending, o.Publication, err)
		}
		return fmt.Errorf("create publication %q: %w", o.Publication, err)
	}
	return nil
}

// AddTableSQL is the statement that adds outbox table o to its publication.
func AddTableSQL(o Outbox) string {
	return fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pgx.Identifier{o.Publication}.Sanitize(), o.qualified())
}

// AddTable adds outbox table o to its publication (AddTableSQL): its inserts are published from the
// statement's commit on. A missing privilege wraps ErrNotSetUp.
func (c *Catalog) AddTable(ctx context.Context, o Outbox) error {
	if _, err := c.conn.Exec(ctx, AddTableSQL(o)); err != nil {
		if isPrivilegeError(err) {
			return fmt.Errorf("%w: %w: add %s to publication %q: %w", ErrNotSetUp, ErrPending, o, o.Publication, err)
		}
		return fmt.Errorf("add %s to publication %q: %w", o, o.Publication, err)
	}
	return nil
}

// TableExists reports whether table o exists.
func (c *Catalog) TableExists(ctx context.Context, o Outbox) (bool, error) {
	var exists bool
	if err := c.conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2)`,
		o.Schema, o.Table).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up table %s: %w", o, err)
	}
	return exists, nil
}

// CreateSlotSQL is the statement CreateSlot runs, with the slot's name as its parameter.
const CreateSlotSQL = `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`

// CreateFailoverSlotSQL is CreateSlotSQL for a failover slot (PostgreSQL 17+: temporary false,
// two-phase false, failover true).
const CreateFailoverSlotSQL = `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`

// CreateSlot creates a pgoutput slot named slot, a failover slot if failover is set; it reports false
// when another process created it meanwhile. A missing privilege wraps ErrNotSetUp.
func (c *Catalog) CreateSlot(ctx context.Context, slot string, failover bool) (created bool, err error) {
	sql := CreateSlotSQL
	if failover {
		sql = CreateFailoverSlotSQL
	}
	_, err = c.conn.Exec(ctx, sql, slot)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42710":
		return false, nil
	case isPrivilegeError(err):
		return false, fmt.Errorf("%w: %w: create replication slot %q: %w", ErrNotSetUp, ErrPending, slot, err)
	default:
		return false, fmt.Errorf("create replication slot %q: %w", slot, withLimitHint(err))
	}
}

// EmitFunctionSQL is the statement that creates the function outbox_emit (sql/outbox_emit.sql) in
// schema with prefix, as the server's format() quotes them.
func (c *Catalog) EmitFunctionSQL(ctx context.Context, template, schema, prefix string) (string, error) {
	var ddl string
	if err := c.conn.QueryRow(ctx, `SELECT format($1, $2::text, $3::text)`, template, schema, prefix).Scan(&ddl); err != nil {
		return "", fmt.Errorf("render the function outbox_emit: %w", err)
	}
	return ddl, nil
}

// EmitFunctionExists reports whether schema has the function outbox_emit of sql/outbox_emit.sql.
func (c *Catalog) EmitFunctionExists(ctx context.Context, schema string) (bool, error) {
	var ok bool
	err := c.conn.QueryRow(ctx, `SELECT to_regprocedure(format('%I.outbox_emit(text,text,text,jsonb,jsonb)', $1::text)) IS NOT NULL`, schema).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("look for the function outbox_emit: %w", err)
	}
	return ok, nil
}

// CreateEmitFunction runs ddl (EmitFunctionSQL).
func (c *Catalog) CreateEmitFunction(ctx context.Context, ddl string) error {
	if _, err := c.conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create the function outbox_emit: %w", err)
	}
	return nil
}
