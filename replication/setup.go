package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
)

// Connect opens a replication connection (replication=database) to the database at t.
func Connect(ctx context.Context, t Target) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(t.URL)
	if err != nil {
		return nil, urlError(err)
	}
	if err := t.password(ctx, cfg); err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	pinSessionSettings(cfg.RuntimeParams) // pgoutput writes values under the walsender's settings
	pinTimers(cfg.RuntimeParams)
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox-cdc"
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL for replication: %w", withLimitHint(err))
	}
	if err := turnOffNewerTimers(ctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	if err := keepStoredBytes(ctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// withLimitHint adds the fix to a server limit's error, by its SQLSTATE (the message may be in the
// server's language): all replication slots in use (53400, when a slot is created) or too many
// connections (53300, when the replication connection opens: max_wal_senders, or a role's or
// database's CONNECTION LIMIT). The error stays transient: a slot or a connection freed elsewhere
// lets the next attempt through.
func withLimitHint(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "53400":
		return fmt.Errorf("%w (the server's limit: raise max_replication_slots, which takes a restart, or drop a slot nothing streams from: SELECT slot_name, active, wal_status FROM pg_replication_slots)", err)
	case "53300":
		return fmt.Errorf("%w (a connection limit: raise max_wal_senders, which takes a restart, or the role's or database's CONNECTION LIMIT, or stop a replication client that is not needed: SELECT application_name, client_addr FROM pg_stat_replication)", err)
	}
	return err
}

// keepStoredBytes makes conn take text as the database stores it when the database's encoding is
// SQL_ASCII. Such a database accepts any byte in text, and the server, converting it to the
// connection's UTF8, refused a row with bytes that are not UTF-8: the walsender ended the stream at
// that row, every time it was replayed — one row stopped the outbox for good. The bytes then pass
// through as they are (Kafka keys, values and headers are bytes); a topic name they make invalid is
// dead-lettered as any invalid topic is.
func keepStoredBytes(ctx context.Context, conn *pgconn.PgConn) error {
	if conn.ParameterStatus("server_encoding") != "SQL_ASCII" {
		return nil
	}
	if _, err := conn.Exec(ctx, "SET client_encoding TO 'SQL_ASCII'").ReadAll(); err != nil {
		return fmt.Errorf("take the SQL_ASCII database's text as stored (client_encoding): %w", err)
	}
	return nil
}

// SplitTable splits "schema.table" (or "table", schema public) into its parts (config.SplitTable).
func SplitTable(qualified string) (schema, table string) { return config.SplitTable(qualified) }

// ErrNotSetUp is returned (wrapped) when the database lacks something outbox-cdc needs and may not or
// cannot create: the outbox table, a suitable publication, the slot, a setting, a privilege.
// Retrying does not help.
var ErrNotSetUp = errors.New("database not set up for outbox-cdc")

// ErrPending is returned (wrapped, beside ErrNotSetUp) when what the database lacks is provided on its
// side while the router waits — the outbox table, the publication or a table's place in it, the
// slot, the REPLICATION attribute, wal_level — by `outbox-cdc init` or an administrator: trying again
// later can succeed without a change of the router's configuration (a fleet retries such a source on
// a backoff). Errors a configuration change must fix never wrap it.
var ErrPending = errors.New("waiting for the database to be set up")

// AlterSlotFailover makes slot a failover slot (PostgreSQL 17+) with ALTER_REPLICATION_SLOT on the
// replication connection conn; the slot must not be in use. Run it before START_REPLICATION, or after
// an exported snapshot has been imported elsewhere (a new command ends the export).
func AlterSlotFailover(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	if _, err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+pgx.Identifier{slot}.Sanitize()+" (FAILOVER true)").ReadAll(); err != nil {
		return fmt.Errorf("make replication slot %q a failover slot: %w", slot, err)
	}
	return nil
}

// CreateSlotWithSnapshot creates the slot on the replication connection conn and exports a snapshot
// of the database exactly at the slot's consistent point. The snapshot can be imported (SET
// TRANSACTION SNAPSHOT) by another connection until conn runs its next command or closes.
func CreateSlotWithSnapshot(ctx context.Context, conn *pgconn.PgConn, slot string) (consistentPoint LSN, snapshot string, err error) {
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, pgx.Identifier{slot}.Sanitize(), "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return 0, "", fmt.Errorf("create replication slot %q with a snapshot: %w", slot, withLimitHint(err))
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, "", fmt.Errorf("parse consistent point %q: %w", res.ConsistentPoint, err)
	}
	return LSN(lsn), res.SnapshotName, nil
}

// Identify returns the cluster's system identifier and the database name: with the slot's name they
// identify a slot across processes (the exactly-once mode's checkpoint key and Kafka transactional
// id). It asks over an ordinary connection (pg_control_system(), executable by everyone unless a
// service revoked it), so that a role without REPLICATION gets set-up's clear error rather than
// this one's; where that is refused it asks IDENTIFY_SYSTEM over a replication connection.
func Identify(ctx context.Context, t Target) (systemID, database string, err error) {
	cat, err := OpenCatalog(ctx, t)
	if err != nil {
		return "", "", err
	}
	err = cat.conn.QueryRow(ctx, "SELECT system_identifier::text, current_database() FROM pg_control_system()").Scan(&systemID, &database)
	_ = cat.Close(context.Background())
	if err == nil {
		return systemID, database, nil
	}
	conn, cerr := Connect(ctx, t)
	if cerr != nil {
		return "", "", fmt.Errorf("identify the database system: %w", errors.Join(err, cerr))
	}
	defer func() { _ = conn.Close(context.Background()) }()
	res, ierr := pglogrepl.IdentifySystem(ctx, conn)
	if ierr != nil {
		return "", "", fmt.Errorf("identify the database system: %w", errors.Join(err, ierr))
	}
	return res.SystemID, res.DBName, nil
}

// Server is what IDENTIFY_SYSTEM and TIMELINE_HISTORY say of the server a replication connection
// reached: which cluster, which timeline, and the timeline's history (where each earlier one ended).
type Server struct {
	// SystemID is the cluster's system identifier (shared by a primary and its physical standbys);
	// Database is the connection's database.
	SystemID, Database string
	// Timeline is the server's current timeline: 1 unless it was promoted from a standby (or recovered
	// to a point in time); History its history, empty on timeline 1.
	Timeline uint32
	History  []checkpoint.TimelineEnd
	// WALEnd is how far the server had flushed its WAL when asked.
	WALEnd LSN
}

// Checkpoint is the server as the exactly-once mode's checkpoint logic sees it.
func (s Server) Checkpoint() checkpoint.Server {
	return checkpoint.Server{Timeline: s.Timeline, History: s.History, WALEnd: s.WALEnd}
}

// TimelineStart is where the server's current timeline began (zero on timeline 1).
func (s Server) TimelineStart() LSN {
	start, _ := s.Checkpoint().TimelineStart(s.Timeline)
	return start
}

// IdentifyServer asks the server behind the replication connection conn (idle, not streaming) who it
// is: IDENTIFY_SYSTEM, and TIMELINE_HISTORY of its timeline when that is not the first. A failure is
// an error, never a default: the timeline is what tells a failover apart.
func IdentifyServer(ctx context.Context, conn *pgconn.PgConn) (Server, error) {
	res, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Server{}, fmt.Errorf("identify the database system (IDENTIFY_SYSTEM): %w", err)
	}
	srv := Server{SystemID: res.SystemID, Database: res.DBName, Timeline: uint32(res.Timeline), WALEnd: LSN(res.XLogPos)}
	if srv.Timeline > 1 {
		hist, err := pglogrepl.TimelineHistory(ctx, conn, res.Timeline)
		if err != nil {
			return Server{}, fmt.Errorf("read the history of timeline %d: %w", srv.Timeline, err)
		}
		if srv.History, err = checkpoint.ParseTimelineHistory(hist.Content); err != nil {
			return Server{}, fmt.Errorf("read the history of timeline %d: %w", srv.Timeline, err)
		}
	}
	return srv, nil
}
