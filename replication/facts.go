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
}

// Prerequisites reads them for the outbox o and slot.
func (c *Catalog) Prerequisites(ctx context.Context, o Outbox, slot string) (Prerequisites, error) {
	var f Prerequisites
	var maxSlots, maxSenders string
	err := c.conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_replication_slots'), current_setting('max_wal_senders'),
		(SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication), `+MayReplicateSQL+`,
		EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1),
		EXISTS (SELECT FROM pg_publication WHERE pubname = $2)`, slot, o.Publication).
		Scan(&f.WALLevel, &maxSlots, &maxSenders, &f.Slots, &f.Senders, &f.Replication, &f.SlotExists, &f.PublicationExists)
	if err != nil {
		return f, fmt.Errorf("read server settings: %w", err)
	}
	f.MaxSlots, _ = strconv.Atoi(maxSlots)
	f.MaxSenders, _ = strconv.Atoi(maxSenders)
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
	// Table is schema.table; RowEstimate is pg_class.reltuples; OldestAgeSeconds is now minus the
	// oldest created-at (0 when unknown or empty).
	Table            string  `json:"table"`
	Exists           bool    `json:"exists"`
	RowEstimate      int64   `json:"row_estimate"`
	OldestAgeSeconds float64 `json:"oldest_row_age_seconds"`
}

// OutboxState reads the outbox table's state; createdAt names its created-at column ("" skips the
// age). The age is read within a 5 s bound: applications that delete what they insert keep the table
// small, others may not.
func (c *Catalog) OutboxState(ctx context.Context, o Outbox, createdAt string) (OutboxState, error) {
	st := OutboxState{Table: o.String()}
	err := c.conn.QueryRow(ctx, `SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		o.Schema, o.Table).Scan(&st.RowEstimate)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("look up the outbox table: %w", err)
	}
	st.Exists = true
	if createdAt != "" {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var age *float64
		q := `SELECT extract(epoch FROM now() - min(` + pgx.Identifier{createdAt}.Sanitize() + `))::float8 FROM ` + o.qualified()
		if err := c.conn.QueryRow(qctx, q).Scan(&age); err == nil && age != nil {
			st.OldestAgeSeconds = *age
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
func (c *Catalog) PublicationSQL(ctx context.Context, o Outbox) (string, error) {
	version, err := c.serverVersion(ctx)
	if err != nil {
		return "", err
	}
	return CreatePublicationSQL(o, version), nil
}

// CreatePublication creates the outbox's publication (PublicationSQL). A missing privilege wraps
// ErrNotSetUp.
func (c *Catalog) CreatePublication(ctx context.Context, o Outbox) error {
	stmt, err := c.PublicationSQL(ctx, o)
	if err != nil {
		return err
	}
	if _, err := c.conn.Exec(ctx, stmt); err != nil {
		if isPrivilegeError(err) {
			return fmt.Errorf("%w: create publication %q: %w", ErrNotSetUp, o.Publication, err)
		}
		return fmt.Errorf("create publication %q: %w", o.Publication, err)
	}
	return nil
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
		return false, fmt.Errorf("%w: create replication slot %q: %w", ErrNotSetUp, slot, err)
	default:
		return false, fmt.Errorf("create replication slot %q: %w", slot, err)
	}
}
