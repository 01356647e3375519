package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Catalog is an ordinary (non-replication) connection to the outbox's database, for everything
// around the stream: the set-up checks and DDL, the slot's state, the outbox's periodic verification,
// resync's marker and lock. Every value travels as a query parameter; identifiers are quoted by pgx.
// It is not safe for concurrent use.
type Catalog struct {
	conn    *pgx.Conn
	version int // server_version_num, once read
}

// OpenCatalog connects to the database at t for catalog work.
func OpenCatalog(ctx context.Context, t Target) (*Catalog, error) {
	return openCatalog(ctx, t, "outbox-cdc")
}

// OpenMonitor connects to the database at t for the slot monitor (application_name
// outbox-cdc-monitor, so that pg_stat_activity tells it apart).
func OpenMonitor(ctx context.Context, t Target) (*Catalog, error) {
	return openCatalog(ctx, t, "outbox-cdc-monitor")
}

func openCatalog(ctx context.Context, t Target, application string) (*Catalog, error) {
	cfg, err := pgx.ParseConfig(t.URL)
	if err != nil {
		return nil, urlError(err)
	}
	if err := t.password(ctx, &cfg.Config); err != nil {
		return nil, err
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = application
	}
	pinTimers(cfg.RuntimeParams)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := turnOffNewerTimers(ctx, conn.PgConn()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return &Catalog{conn: conn}, nil
}

// Close closes the connection.
func (c *Catalog) Close(ctx context.Context) error { return c.conn.Close(ctx) }

// Server is the address (host:port) of the server the catalog connection reached: with a
// multi-host URL, the one that answered.
func (c *Catalog) Server() string {
	if nc := c.conn.PgConn().Conn(); nc != nil && nc.RemoteAddr() != nil {
		return nc.RemoteAddr().String()
	}
	return ""
}

// Outbox names the outbox table and the publication that carries it. A source of WAL messages only
// (Options.MessagePrefixes) has no table: Table is empty, and only the publication is set up and
// checked (HasTable).
type Outbox struct {
	// Schema and Table name the outbox table.
	Schema, Table string
	// Publication names the publication.
	Publication string
}

// HasTable reports whether o names a table: false for a source of WAL messages only.
func (o Outbox) HasTable() bool { return o.Table != "" }

// qualified is the table's quoted, schema-qualified name.
func (o Outbox) qualified() string { return pgx.Identifier{o.Schema, o.Table}.Sanitize() }

// String is schema.table.
func (o Outbox) String() string { return o.Schema + "." + o.Table }

// ColumnRole is a column the router reads, with the configuration key that names it.
type ColumnRole struct {
	// Column is the column's name; Key the configuration key that set it (for error messages).
	Column, Key string
	// Required is true for columns without which no record can be built (event_id, event_type,
	// aggregate_id, payload): their absence stops the stream.
	Required bool
}

// ErrOutboxChanged is returned (wrapped) when the outbox table is no longer what the stream can read
// in full: dropped, removed from the publication, or without a column the router needs. Confirming
// further could skip committed events, so the stream stops; the operator must act.
var ErrOutboxChanged = errors.New("the outbox table changed under the stream")

// SetupOptions say what Setup checks and may create.
type SetupOptions struct {
	// Outbox names the table and publication.
	Outbox Outbox
	// Tables are further outbox tables the publication must carry (their Publication is ignored).
	Tables []Outbox
	// Slot names the replication slot.
	Slot string
	// Columns are the columns the router reads.
	Columns []ColumnRole
	// CreatePublication and CreateSlot allow creating missing objects.
	CreatePublication, CreateSlot bool
	// SkipSlot leaves the slot alone (resync manages it).
	SkipSlot bool
	// FailoverSlot is postgres.failover_slot (auto, on, off): a slot Setup creates is a failover slot
	// when it resolves to true (Catalog.WantFailover).
	FailoverSlot string
	// SlotSeen is true when this process already streamed from the slot: if it is missing now, it was
	// dropped or the server failed over to one without it, and Setup refuses (ErrSlotLost) rather than
	// create a new slot that would silently skip what was committed in between.
	SlotSeen bool
	// Server is the server the replication connection that will stream reached (IdentifyServer): the
	// catalog connection must have reached the same one, and its timeline decides whether a missing
	// slot may be created. Required unless SkipSlot.
	Server Server
	// PublicationSeen is true when this process already streamed with the publication: if it is
	// missing now, it was dropped under the router, and Setup refuses to create it (see
	// MissingPublicationError), as it does whenever the slot exists.
	PublicationSeen bool
	// ApplicationName is the application_name of the replication connection that will stream (its
	// ParameterStatus): Setup warns when synchronous_standby_names names it. Empty: not checked.
	ApplicationName string
	// Ignore are the published tables whose rows are not for this router (postgres.ignore_tables):
	// every other table the publication carries beside the outbox tables is refused (ErrUnlistedTable).
	Ignore IgnoredTables
}

// SetupResult says what Setup found and did.
type SetupResult struct {
	// CreatedPublication and CreatedSlot are true when Setup created them.
	CreatedPublication, CreatedSlot bool
	// Slot is the slot's state after set-up (zero with SkipSlot), also when Setup returns an error
	// because the slot is in use.
	Slot SlotState
	// Verified is the outbox's first verification: confirms may go up to its LSN.
	Verified Verification
	// WantFailover is postgres.failover_slot resolved for this server: an existing slot that is not
	// a failover slot should be altered to one (AlterSlotFailover) before streaming.
	WantFailover bool
	// Warnings are things the operator should know that do not stop the router (a missing optional
	// column, a publication row filter).
	Warnings []string
	// Missing are the optional columns the tables lack (warned in Warnings): Options.Missing, so
	// that the stream does not warn of them again.
	Missing []MissingColumn
	// Changed says what Setup changed in the database, one line each (a table added to the
	// publication, and the rows it already held): said once, also when Setup then returns an
	// error (the slot in use, say), unlike Warnings, which every session repeats.
	Changed []string
}

// MissingColumn is an optional column an outbox table lacks: Table is the table's index (0 for the
// outbox, i+1 for the further table i, as Row.Table counts).
type MissingColumn struct {
	Table  int
	Column string
}

// Setup checks everything the stream needs and creates the publication and the slot when allowed:
// wal_level, the role's REPLICATION attribute, a logged table (or partitioned table) with the
// required columns, a publication that publishes its inserts (via the partition root for a
// partitioned table, without a column list that leaves a required column out), and a pgoutput slot of
// this database that is not lost. Problems that retrying cannot fix wrap ErrNotSetUp.
func (c *Catalog) Setup(ctx context.Context, o SetupOptions) (SetupResult, error) {
	var res SetupResult
	var walLevel string
	var replication bool
	if err := c.conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num')::int,
		`+MayReplicateSQL).Scan(&walLevel, &c.version, &replication); err != nil {
		return res, fmt.Errorf("read server settings: %w", err)
	}
	if walLevel != "logical" {
		return res, fmt.Errorf("%w: %w: wal_level is %q, logical decoding needs logical: ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL", ErrNotSetUp, ErrPending, walLevel)
	}
	if !replication {
		return res, errNoReplication
	}
	if !o.SkipSlot {
		if err := c.sameServer(ctx, o.Server); err != nil {
			return res, err
		}
	}
	tables := o.tables()
	facts := make([]tableFacts, len(tables))
	for i, t := range tables {
		var err error
		if facts[i], err = c.table(ctx, t); err != nil {
			return res, err
		}
		for _, role := range o.Columns {
			if !slices.Contains(facts[i].columns, role.Column) {
				if role.Required {
					return res, fmt.Errorf("%w: %w: outbox table %s has no column %q (%s): set %s to the column's name, or add it (sql/outbox.sql)",
						ErrNotSetUp, ErrPending, t, role.Column, role.Key, role.Key)
				}
				res.Warnings = append(res.Warnings, fmt.Sprintf("outbox table %s has no column %q (%s): records go without it", t, role.Column, role.Key))
				res.Missing = append(res.Missing, MissingColumn{Table: i, Column: role.Column})
			}
		}
	}

	var slot SlotState
	var err error
	if !o.SkipSlot {
		// Read first: a slot that exists decides whether a missing publication may be created.
		if slot, err = c.Slot(ctx, o.Slot); err != nil {
			return res, err
		}
	}
	created, warnings, err := c.publication(ctx, o, facts, slot.Exists, &res.Changed)
	if err != nil {
		return res, err
	}
	res.CreatedPublication = created
	res.Warnings = append(res.Warnings, warnings...)
	if w, err := c.synchronousWarning(ctx, o.ApplicationName); err != nil {
		return res, err
	} else if w != "" {
		res.Warnings = append(res.Warnings, w)
	}
	if res.Verified, err = c.VerifyOutbox(ctx, o.Outbox, o.Tables...); err != nil {
		return res, err
	}
	if o.SkipSlot {
		return res, nil
	}
	if res.WantFailover, err = c.WantFailover(ctx, o.FailoverSlot); err != nil {
		return res, err
	}
	if !slot.Exists {
		if o.SlotSeen {
			return res, fmt.Errorf("%w: replication slot %q, which this process was streaming from, has disappeared: it was dropped, or the server failed over to one without it. "+
				"A new slot would start from now and silently skip what was committed in between, so none is created: recover rows still in the outbox with `outbox-cdc resync`",
				ErrSlotLost, o.Slot)
		}
		if !o.CreateSlot {
			return res, fmt.Errorf("%w: %w: replication slot %q does not exist and postgres.create_slot is off (create it with outbox-cdc init, or outbox-cdc resync)", ErrNotSetUp, ErrPending, o.Slot)
		}
		if tl := o.Server.Timeline; tl > 1 {
			return res, fmt.Errorf("%w: replication slot %q does not exist, and this server was promoted from a standby (timeline %d). If the router streamed from the previous primary, "+
				"what was committed between its last position and the failover is in no slot here, and a new slot would silently skip it, so run does not create one: "+
				"recover with `outbox-cdc resync` (it creates the slot and republishes the rows still in the outbox); on a first start, create the slot with `outbox-cdc init`",
				ErrSlotLost, o.Slot, tl)
		}
		if res.CreatedSlot, err = c.CreateSlot(ctx, o.Slot, res.WantFailover); err != nil {
			return res, err
		}
		if res.CreatedSlot {
			// Rows written while no slot existed (before the first start, or while the source
			// waited) are in no slot: say so, and how to replay them.
			for _, t := range tables {
				w, err := c.rowsBefore(ctx, t, "replication slot "+strconv.Quote(o.Slot)+" was created")
				if err != nil {
					return res, err
				}
				if w != "" {
					res.Warnings = append(res.Warnings, w)
				}
			}
		}
		if slot, err = c.Slot(ctx, o.Slot); err != nil {
			return res, err
		}
	}
	res.Slot = slot
	return res, slot.usable(o.Slot)
}

// tables returns every outbox table, each with the publication: Outbox first, then Tables.
func (o SetupOptions) tables() []Outbox {
	if !o.Outbox.HasTable() {
		return nil // WAL messages only: no table to set up
	}
	return withPublication(o.Outbox, o.Tables)
}

// withPublication returns o and more, each of more with o's publication.
func withPublication(o Outbox, more []Outbox) []Outbox {
	all := []Outbox{o}
	for _, t := range more {
		t.Publication = o.Publication
		all = append(all, t)
	}
	return all
}

// errNoReplication is the refusal of a role that may not stream.
var errNoReplication = fmt.Errorf("%w: %w: the role lacks the REPLICATION attribute: ALTER ROLE <role> REPLICATION (as a superuser; on Amazon RDS: GRANT rds_replication TO <role>), or use the role from sql/role.sql", ErrNotSetUp, ErrPending)

// ExplainConnectFailure turns the failure of a replication connection into set-up's clearer error
// when the reason is one set-up names (a role without REPLICATION, wal_level below logical), asking
// over this ordinary connection; otherwise it returns err.
func (c *Catalog) ExplainConnectFailure(ctx context.Context, err error) error {
	var walLevel string
	var replication bool
	if qerr := c.conn.QueryRow(ctx, `SELECT current_setting('wal_level'), `+MayReplicateSQL).Scan(&walLevel, &replication); qerr != nil {
		return err
	}
	switch {
	case walLevel != "logical":
		return fmt.Errorf("%w: wal_level is %q, logical decoding needs logical: ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL", ErrNotSetUp, walLevel)
	case !replication:
		return errNoReplication
	}
	return err
}

// ErrOtherServer is returned (wrapped) when the catalog connection reached another server than the
// replication connection (a multi-host URL during a failover): set-up must read the slot of the
// server that streams. Retrying helps once both reach the new primary.
var ErrOtherServer = errors.New("the catalog and replication connections reached different servers")

// sameServer checks that this connection reached the server srv describes: the same cluster (system
// identifier) on the same timeline. Where the role may not ask one of them (EXECUTE revoked, or a
// platform without WAL file names), the others must do: at least that this connection reached a
// primary, not a standby of the same cluster.
func (c *Catalog) sameServer(ctx context.Context, srv Server) error {
	if srv.Timeline == 0 {
		return errors.New("set-up: the streaming server's identity is unknown")
	}
	tl, err := c.Timeline(ctx)
	if unavailable(err) {
		tl, err = srv.Timeline, nil
		var recovery bool
		if rerr := c.conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); rerr != nil {
			return fmt.Errorf("read whether the server is a standby: %w", rerr)
		}
		if recovery {
			return fmt.Errorf("%w: the catalog connection reached a standby", ErrOtherServer)
		}
	}
	if err != nil {
		return err
	}
	var sysID string
	err = c.conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysID)
	if unavailable(err) {
		sysID, err = srv.SystemID, nil
	}
	if err != nil {
		return fmt.Errorf("read the system identifier: %w", err)
	}
	if sysID != srv.SystemID || tl != srv.Timeline {
		return fmt.Errorf("%w: system %s on timeline %d, and system %s on timeline %d", ErrOtherServer, sysID, tl, srv.SystemID, srv.Timeline)
	}
	return nil
}

// unavailable reports an error of a function the role may not run or the platform does not offer
// (SQLSTATE class 42, or 0A000): asking again cannot help.
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	return isPrivilegeError(err) || errors.As(err, &pgErr) && pgErr.Code == "0A000"
}

// Timeline returns the server's current timeline: 1 on a server that was never promoted from a
// standby (or restored to a point in time). It reads the timeline from the current WAL file's name, which
// changes at a promotion at once (pg_control_checkpoint() follows only at the next checkpoint).
func (c *Catalog) Timeline(ctx context.Context) (uint32, error) {
	var name string
	if err := c.conn.QueryRow(ctx, "SELECT pg_walfile_name(pg_current_wal_lsn())").Scan(&name); err != nil {
		return 0, fmt.Errorf("read the timeline: %w", err)
	}
	if len(name) < 8 {
		return 0, fmt.Errorf("read the timeline: unexpected WAL file name %q", name)
	}
	tl, err := strconv.ParseUint(name[:8], 16, 32)
	if err != nil {
		return 0, fmt.Errorf("read the timeline from WAL file name %q: %w", name, err)
	}
	return uint32(tl), nil
}

// BaseType returns the base type of a domain (through domains over domains), or oid itself for any
// other type, and for a type that no longer exists.
func (c *Catalog) BaseType(ctx context.Context, oid uint32) (uint32, error) {
	var base uint32
	err := c.conn.QueryRow(ctx, `WITH RECURSIVE d(oid, base, kind, depth) AS (
			SELECT oid, typbasetype, typtype::text, 0 FROM pg_type WHERE oid = $1
			UNION ALL
			SELECT t.oid, t.typbasetype, t.typtype::text, d.depth + 1 FROM pg_type t JOIN d ON t.oid = d.base WHERE d.kind = 'd' AND d.depth < 64)
		SELECT coalesce((SELECT oid FROM d WHERE kind <> 'd' ORDER BY depth DESC LIMIT 1), $1)`, oid).Scan(&base)
	if err != nil {
		return 0, fmt.Errorf("look up the base type of type %d: %w", oid, err)
	}
	return base, nil
}

// MayReplicateSQL is a scalar subquery that is true when the current role may stream logical
// replication: it has REPLICATION, is a superuser, or is a member of rds_replication (Amazon RDS and
// Aurora grant the right through that role, leaving the attribute false).
const MayReplicateSQL = `(SELECT r.rolreplication OR r.rolsuper OR EXISTS (SELECT FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'member'))
		FROM pg_roles r WHERE r.rolname = current_user)`

// serverVersion returns server_version_num, read once per connection.
func (c *Catalog) serverVersion(ctx context.Context) (int, error) {
	if c.version == 0 {
		if err := c.conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&c.version); err != nil {
			return 0, fmt.Errorf("read server_version_num: %w", err)
		}
	}
	return c.version, nil
}

// ShuttingDown reports whether err says the server is shutting down or not yet accepting
// connections (SQLSTATE 57P01, 57P02, 57P03): at a shutdown the walsender waits for its client to
// confirm everything it sent, so a client that cannot confirm must let go of the connection.
func ShuttingDown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	return err != nil && strings.Contains(err.Error(), "the database system is shutting down")
}

// isPrivilegeError reports SQLSTATE class 42 (syntax error or access rule violation).
func isPrivilegeError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42")
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
