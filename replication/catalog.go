package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
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

// tableFacts are the outbox table's catalog entry.
type tableFacts struct {
	oid         uint32
	partitioned bool
	columns     []string
	generated   []string // generated columns (GENERATED ALWAYS AS ..., STORED or VIRTUAL)
	virtual     []string // the VIRTUAL ones (PostgreSQL 18 on; its default): never published
}

func (c *Catalog) table(ctx context.Context, o Outbox) (tableFacts, error) {
	var t tableFacts
	var kind, persistence string
	err := c.conn.QueryRow(ctx, `SELECT c.oid, c.relkind::text, c.relpersistence::text,
		array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum),
		array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> '' ORDER BY a.attnum),
		array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = 'v' ORDER BY a.attnum)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		o.Schema, o.Table).Scan(&t.oid, &kind, &persistence, &t.columns, &t.generated, &t.virtual)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("%w: %w: outbox table %s does not exist (postgres.table, tables); create it with outbox-cdc init --create-table, or from sql/outbox.sql", ErrNotSetUp, ErrPending, o)
	}
	if err != nil {
		return t, fmt.Errorf("look up outbox table %s: %w", o, err)
	}
	what := map[string]string{"v": "a view", "m": "a materialized view", "f": "a foreign table", "S": "a sequence", "i": "an index", "I": "an index", "c": "a composite type"}[kind]
	switch {
	case what != "":
		return t, fmt.Errorf("%w: postgres.table %s is %s; outbox-cdc reads the inserts of a table (or partitioned table) from the WAL: point postgres.table at the table itself", ErrNotSetUp, o, what)
	case persistence == "u":
		return t, fmt.Errorf("%w: %w: outbox table %s is UNLOGGED: its rows never reach the WAL, so no replication can see them: ALTER TABLE %s SET LOGGED", ErrNotSetUp, ErrPending, o, o.qualified())
	case persistence == "t":
		return t, fmt.Errorf("%w: outbox table %s is a temporary table, which logical replication cannot see", ErrNotSetUp, o)
	}
	t.partitioned = kind == "p"
	if !t.partitioned {
		var children []string
		if err := c.conn.QueryRow(ctx, `SELECT array(SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1 ORDER BY 1)`, t.oid).Scan(&children); err != nil {
			return t, fmt.Errorf("look up the inheritance children of %s: %w", o, err)
		}
		if len(children) > 0 {
			return t, fmt.Errorf("%w: %w: %s", ErrNotSetUp, ErrPending, inheritanceError(o, children))
		}
	}
	return t, nil
}

// MissingPublicationError is the refusal to create the outbox's publication while its slot exists
// (or after this process streamed with it): the publication was dropped after the slot was created,
// and one created now does not exist at the slot's position in the WAL. Decoding from there fails
// with "publication does not exist" on every session (on PostgreSQL 18 it skips every change before
// the new publication instead). Only a new slot, after the publication, streams again.
func MissingPublicationError(o Outbox, slot string) error {
	return fmt.Errorf("%w: publication %q does not exist, but replication slot %q does: the publication was dropped after the slot was created. "+
		"A publication created now would not exist at the slot's position in the WAL, so decoding from there would fail on every session, or skip the changes before it; "+
		"none is created. Recover with `outbox-cdc resync`: it creates the publication and then the slot anew, and republishes the rows still in the outbox",
		ErrOutboxChanged, o.Publication, slot)
}

// publication checks (or creates) the publication for the tables (facts in the order of o.tables()).
// slotExists says whether the slot exists (then a missing publication is refused, not created).
func (c *Catalog) publication(ctx context.Context, o SetupOptions, facts []tableFacts, slotExists bool, changed *[]string) (created bool, warnings []string, err error) {
	pub := pgx.Identifier{o.Outbox.Publication}.Sanitize()
	tables := o.tables()
	var insert, viaRoot, generated, all bool
	gencols := "false"
	if c.version >= 180000 { // read by Setup just before
		gencols = "pubgencols::text = 's'"
	}
	err = c.conn.QueryRow(ctx, `SELECT pubinsert, pubviaroot, `+gencols+`, puballtables FROM pg_publication WHERE pubname = $1`, o.Outbox.Publication).Scan(&insert, &viaRoot, &generated, &all)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && !o.CreatePublication:
		return false, nil, fmt.Errorf("%w: %w: publication %q does not exist and postgres.create_publication is off: %s (or outbox-cdc init)",
			ErrNotSetUp, ErrPending, o.Outbox.Publication, CreatePublicationSQL(o.Outbox, 0, o.Tables...))
	case errors.Is(err, pgx.ErrNoRows) && (slotExists || o.PublicationSeen):
		return false, nil, MissingPublicationError(o.Outbox, o.Slot)
	case errors.Is(err, pgx.ErrNoRows):
		// A publication created now carries generated columns where the server can (18 and later).
		for _, t := range facts {
			if err := c.generatedColumnsError(o, t, true, nil); err != nil {
				return false, nil, err
			}
		}
		if err := c.CreatePublication(ctx, o.Outbox, o.Tables...); err != nil {
			return false, nil, err
		}
		for _, t := range facts {
			warnings = append(warnings, c.generatedColumns(o, t, true, nil)...)
		}
		return true, warnings, nil
	case err != nil:
		return false, nil, fmt.Errorf("look up publication %q: %w", o.Outbox.Publication, err)
	case !insert:
		return false, nil, fmt.Errorf("%w: %w: publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", ErrNotSetUp, ErrPending, o.Outbox.Publication, pub)
	}
	for i, t := range tables {
		w, err := c.publishes(ctx, o, t, facts[i], viaRoot, generated, changed)
		if err != nil {
			return false, nil, err
		}
		warnings = append(warnings, w...)
	}
	return false, warnings, c.unlistedTables(ctx, o, all)
}

// rowsBefore warns when table t already holds rows at a start of streaming (when): they were
// written before it and never reach the stream; `outbox-cdc resync` republishes them. Empty when the
// table is empty.
func (c *Catalog) rowsBefore(ctx context.Context, t Outbox, when string) (string, error) {
	st, err := c.OutboxState(ctx, t, "")
	if err != nil || st.RowEstimate == 0 {
		return "", err
	}
	n := fmt.Sprint(st.RowEstimate)
	if st.RowsAtLeast {
		n = "at least " + n
	}
	return fmt.Sprintf("%s holds %s rows written before %s: they are not streamed; if they are events not yet delivered, replay them with `outbox-cdc resync`", t, n, when), nil
}

// publishes checks that the existing publication carries table t (facts f) whole: via the root when
// it is partitioned, with the columns the router reads.
func (c *Catalog) publishes(ctx context.Context, o SetupOptions, t Outbox, f tableFacts, viaRoot, generated bool, changed *[]string) (warnings []string, err error) {
	pub := pgx.Identifier{o.Outbox.Publication}.Sanitize()
	if f.partitioned && !viaRoot {
		return nil, fmt.Errorf("%w: %w: outbox table %s is partitioned and publication %q does not publish via the partition root, so its rows would arrive under each partition's name: ALTER PUBLICATION %s SET (publish_via_partition_root = true)",
			ErrNotSetUp, ErrPending, t, o.Outbox.Publication, pub)
	}
	// The table must be in the publication; since PostgreSQL 15 a column list can leave columns out
	// and a row filter can leave rows out.
	var in bool
	var published []string
	var filter *string
	q := `SELECT true, NULL::text[], NULL::text FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`
	if c.version >= 150000 { // read by Setup just before
		q = `SELECT true, attnames::text[], rowfilter FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`
	}
	err = c.conn.QueryRow(ctx, q, o.Outbox.Publication, t.Schema, t.Table).Scan(&in, &published, &filter)
	if errors.Is(err, pgx.ErrNoRows) && o.CreatePublication {
		// A table added to the configuration (a rolling update, say): the publication follows it, as
		// init would make it. An instance still streaming without it stops at its first row
		// (ErrUnlistedTable), so that one with this configuration delivers it.
		if err := c.AddTable(ctx, t); err != nil {
			return nil, err
		}
		*changed = append(*changed, fmt.Sprintf("added %s to publication %q (postgres.create_publication): its inserts are streamed from now on; an instance streaming without it in its configuration stops at its first row", t, o.Outbox.Publication))
		w, err := c.rowsBefore(ctx, t, "the publication took it")
		if w != "" {
			*changed = append(*changed, w)
		}
		return nil, err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %w: publication %q does not include %s: ALTER PUBLICATION %s ADD TABLE %s (or outbox-cdc init)",
			ErrNotSetUp, ErrPending, o.Outbox.Publication, t, pub, t.qualified())
	}
	if err != nil {
		return nil, fmt.Errorf("look up the tables of publication %q: %w", o.Outbox.Publication, err)
	}
	for _, role := range o.Columns {
		// Generated columns are left out of pg_publication_tables' list unless published; they are
		// checked below.
		if published != nil && slices.Contains(f.columns, role.Column) && !slices.Contains(f.generated, role.Column) && !slices.Contains(published, role.Column) {
			if role.Required {
				return nil, fmt.Errorf("%w: %w: publication %q's column list for %s leaves out %q (%s): ALTER PUBLICATION %s SET TABLE %s (without a column list, or with the column)",
					ErrNotSetUp, ErrPending, o.Outbox.Publication, t, role.Column, role.Key, pub, t.qualified())
			}
			warnings = append(warnings, fmt.Sprintf("publication %q's column list for %s leaves out %q (%s): records go without it", o.Outbox.Publication, t, role.Column, role.Key))
		}
	}
	if filter != nil {
		warnings = append(warnings, fmt.Sprintf("publication %q has a row filter on the outbox %s, %s: rows it leaves out are never delivered", o.Outbox.Publication, t, *filter))
	}
	if err := c.generatedColumnsError(o, f, generated, published); err != nil {
		return nil, err
	}
	return append(warnings, c.generatedColumns(o, f, generated, published)...), nil
}

// unpublishedGenerated returns the generated columns the router reads that the publication does not
// carry: every one before PostgreSQL 18, which never publishes generated columns; from 18 on, the
// VIRTUAL ones (never published) and those the publication neither publishes
// (publish_generated_columns = stored) nor names in its column list.
func (c *Catalog) unpublishedGenerated(o SetupOptions, t tableFacts, publishesGenerated bool, columnList []string) (required, optional []ColumnRole) {
	for _, role := range o.Columns {
		if !slices.Contains(t.generated, role.Column) {
			continue
		}
		if c.version >= 180000 && !slices.Contains(t.virtual, role.Column) && (publishesGenerated || slices.Contains(columnList, role.Column)) {
			continue
		}
		if role.Required {
			required = append(required, role)
		} else {
			optional = append(optional, role)
		}
	}
	return required, optional
}

// generatedFix says how to have a generated column's value reach the router.
func (c *Catalog) generatedFix(o SetupOptions, t tableFacts, column string) string {
	if slices.Contains(t.virtual, column) {
		return fmt.Sprintf("it is VIRTUAL (PostgreSQL 18's default for GENERATED ALWAYS AS), and virtual generated columns are never published: re-create it STORED (ALTER TABLE ... DROP COLUMN %[1]s, then ADD COLUMN %[1]s ... GENERATED ALWAYS AS (...) STORED), or make it an ordinary column",
			pgx.Identifier{column}.Sanitize())
	}
	if c.version >= 180000 {
		return fmt.Sprintf("ALTER PUBLICATION %s SET (publish_generated_columns = stored)", pgx.Identifier{o.Outbox.Publication}.Sanitize())
	}
	return "PostgreSQL before 18 never publishes generated columns: make it an ordinary column the application (or a trigger) fills, or upgrade to PostgreSQL 18, where the publication can publish it (publish_generated_columns = stored)"
}

// generatedColumnsError refuses a required column that is generated and not published: every row
// would arrive without it, and the stream would stop at the first one.
func (c *Catalog) generatedColumnsError(o SetupOptions, t tableFacts, publishesGenerated bool, columnList []string) error {
	required, _ := c.unpublishedGenerated(o, t, publishesGenerated, columnList)
	if len(required) == 0 {
		return nil
	}
	role := required[0]
	return fmt.Errorf("%w: outbox column %q (%s) is a generated column, and publication %q does not carry it, so no row would reach the router with it: %s",
		ErrNotSetUp, role.Column, role.Key, o.Outbox.Publication, c.generatedFix(o, t, role.Column))
}

// generatedColumns warns of optional columns that are generated and not published.
func (c *Catalog) generatedColumns(o SetupOptions, t tableFacts, publishesGenerated bool, columnList []string) []string {
	_, optional := c.unpublishedGenerated(o, t, publishesGenerated, columnList)
	var warnings []string
	for _, role := range optional {
		warnings = append(warnings, fmt.Sprintf("outbox column %q (%s) is a generated column that publication %q does not carry: records go without it (%s)",
			role.Column, role.Key, o.Outbox.Publication, c.generatedFix(o, t, role.Column)))
	}
	return warnings
}

// CreatePublicationSQL is the statement that creates the outbox's publication on a server of
// serverVersion (server_version_num): inserts only (so that applications may delete what they insert),
// via the partition root (so that a partitioned outbox's rows arrive under its own name), and from
// PostgreSQL 18 on with generated columns (so that a generated event_type reaches the router).
//
// more are further outbox tables the publication carries (their Publication is ignored).
func CreatePublicationSQL(o Outbox, serverVersion int, more ...Outbox) string {
	with := "publish = 'insert', publish_via_partition_root = true"
	if serverVersion >= 180000 {
		with += ", publish_generated_columns = stored"
	}
	names := make([]string, 0, 1+len(more))
	for _, t := range withPublication(o, more) {
		if t.HasTable() {
			names = append(names, t.qualified())
		}
	}
	if len(names) == 0 {
		// WAL messages only: the stream needs a publication to name, and it carries no table.
		return fmt.Sprintf("CREATE PUBLICATION %s WITH (%s)", pgx.Identifier{o.Publication}.Sanitize(), with)
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s)", pgx.Identifier{o.Publication}.Sanitize(), strings.Join(names, ", "), with)
}

// Verification is one observation that the stream still sees every outbox insert: at LSN the table
// existed and its publication published its inserts. It also says which catalog rows made it so, so
// that two observations tell whether the outbox stayed published in between (Continues).
type Verification struct {
	// LSN is pg_current_wal_lsn() read just before the catalog was checked. A commit is in the WAL
	// shortly before it is visible, so a catalog change committed just below LSN may not yet be seen:
	// only the position of an earlier verification is safe to confirm up to.
	LSN LSN
	// TableOID identifies the outbox table; it changes when the table is dropped and re-created.
	TableOID uint32
	// PublicationOID identifies the publication; it changes when it is dropped and re-created.
	PublicationOID uint32
	// Membership names the catalog rows that put the table in the publication: "all" for a
	// publication FOR ALL TABLES, "table:<oid>" for a pg_publication_rel row (of the table or an
	// ancestor), "schema:<oid>" for a pg_publication_namespace row. Removing the table and adding it
	// back makes a new row, so the membership of two observations shares a row only while the table
	// stayed in the publication throughout.
	Membership []string
	// More are the observations of the further outbox tables VerifyOutbox was given, in their order
	// (each with the same LSN).
	More []Verification
}

// Continues reports, as an error wrapping ErrOutboxChanged, whether something happened between the
// earlier observation prev and v that the stream cannot have followed: the table or the publication
// dropped and re-created, or the table removed from the publication and added back. Rows inserted
// in between may never have been published.
//
// more are the further outbox tables, in the order of More.
func (v Verification) Continues(prev Verification, o Outbox, more ...Outbox) error {
	if err := v.continues(prev, o); err != nil {
		return err
	}
	for i, t := range withPublication(o, more)[1:] {
		if i < len(v.More) && i < len(prev.More) {
			if err := v.More[i].continues(prev.More[i], t); err != nil {
				return err
			}
		}
	}
	return nil
}

// continues is Continues for one table.
func (v Verification) continues(prev Verification, o Outbox) error {
	resync := "rows inserted meanwhile may never have reached the stream; nothing past the last verified position was confirmed. Replay the rows still in the outbox with `outbox-cdc resync`"
	switch {
	case prev.TableOID != 0 && v.TableOID != prev.TableOID:
		return fmt.Errorf("%w: outbox table %s was dropped and created again (oid %d, now %d): %s", ErrOutboxChanged, o, prev.TableOID, v.TableOID, resync)
	case prev.PublicationOID != 0 && v.PublicationOID != prev.PublicationOID:
		return fmt.Errorf("%w: publication %q was dropped and created again (oid %d, now %d): %s", ErrOutboxChanged, o.Publication, prev.PublicationOID, v.PublicationOID, resync)
	case len(prev.Membership) > 0 && !slices.ContainsFunc(v.Membership, func(m string) bool { return slices.Contains(prev.Membership, m) }):
		return fmt.Errorf("%w: outbox table %s left publication %q and was added back (membership %v, now %v): %s",
			ErrOutboxChanged, o, o.Publication, prev.Membership, v.Membership, resync)
	}
	return nil
}

// VerifyOutbox checks, in one round trip, that the outbox table still exists, has no inheritance
// children, and is still published (the publication exists, publishes inserts, includes the table, and
// publishes a partitioned table via its root). A failed check wraps ErrOutboxChanged; on success the
// Verification says where and by which catalog rows. more are further outbox tables of the same
// publication, checked in the same round trip (Verification.More, in their order).
func (c *Catalog) VerifyOutbox(ctx context.Context, o Outbox, more ...Outbox) (Verification, error) {
	var v Verification
	version, err := c.serverVersion(ctx)
	if err != nil {
		return v, err
	}
	schemas := "NULL::text"
	if version >= 150000 { // FOR TABLES IN SCHEMA
		schemas = `(SELECT string_agg('schema:' || pn.oid, ',') FROM pg_publication_namespace pn, tree
			WHERE pn.pnpubid = (SELECT oid FROM p) AND pn.pnnspid = tree.relnamespace)`
	}
	// The position is read first, in its own statement: the catalog check's snapshot is then taken
	// after it, so that every catalog change visible before the position was read is seen.
	var lsnText string
	if !o.HasTable() {
		return c.verifyPublication(ctx, o)
	}
	tables := withPublication(o, more)
	facts := make([]publishedFacts, len(tables))
	batch := &pgx.Batch{}
	batch.Queue(`SELECT pg_current_wal_lsn()::text`).QueryRow(func(row pgx.Row) error { return row.Scan(&lsnText) })
	for i, t := range tables {
		f := &facts[i]
		batch.Queue(`WITH RECURSIVE t AS (SELECT c.oid, c.relkind::text AS kind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $2 AND c.relname = $3),
			p AS (SELECT oid, pubinsert, pubviaroot, puballtables FROM pg_publication WHERE pubname = $1),
			tree(oid, relnamespace) AS (SELECT c.oid, c.relnamespace FROM pg_class c WHERE c.oid = (SELECT oid FROM t)
				UNION SELECT c.oid, c.relnamespace FROM pg_inherits i JOIN tree ON i.inhrelid = tree.oid JOIN pg_class c ON c.oid = i.inhparent)
		SELECT (SELECT oid FROM t), (SELECT kind FROM t), (SELECT oid FROM p),
			coalesce((SELECT pubinsert FROM p), false), coalesce((SELECT pubviaroot FROM p), false), coalesce((SELECT puballtables FROM p), false),
			EXISTS (SELECT FROM pg_publication_tables pt WHERE pt.pubname = $1 AND pt.schemaname = $2 AND pt.tablename = $3),
			(SELECT string_agg('table:' || pr.oid, ',') FROM pg_publication_rel pr, tree WHERE pr.prpubid = (SELECT oid FROM p) AND pr.prrelid = tree.oid),
			`+schemas+`,
			array(SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = (SELECT oid FROM t) AND (SELECT kind FROM t) = 'r' ORDER BY 1)`,
			t.Publication, t.Schema, t.Table).
			QueryRow(func(row pgx.Row) error {
				return row.Scan(&f.oid, &f.kind, &f.pubOID, &f.insert, &f.viaRoot, &f.all, &f.member, &f.tables, &f.inSchemas, &f.children)
			})
	}
	if err := c.conn.SendBatch(ctx, batch).Close(); err != nil {
		return v, fmt.Errorf("verify the outbox's publication: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return v, fmt.Errorf("parse pg_current_wal_lsn %q: %w", lsnText, err)
	}
	for i, t := range tables {
		tv, err := facts[i].verification(t)
		if err != nil {
			return Verification{LSN: LSN(lsn)}, err
		}
		tv.LSN = LSN(lsn)
		if i == 0 {
			v = tv
		} else {
			v.More = append(v.More, tv)
		}
	}
	return v, nil
}

// verifyPublication is VerifyOutbox for a source of WAL messages only: the publication the stream
// names still exists (the same one) and publishes inserts. Messages are not published per table:
// what protects them is the prefix, the slot's database and the slot.
func (c *Catalog) verifyPublication(ctx context.Context, o Outbox) (Verification, error) {
	var v Verification
	var lsnText string
	var oid *uint32
	batch := &pgx.Batch{}
	batch.Queue(`SELECT pg_current_wal_lsn()::text`).QueryRow(func(row pgx.Row) error { return row.Scan(&lsnText) })
	batch.Queue(`SELECT oid FROM pg_publication WHERE pubname = $1`, o.Publication).
		QueryRow(func(row pgx.Row) error {
			if err := row.Scan(&oid); !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return nil
		})
	if err := c.conn.SendBatch(ctx, batch).Close(); err != nil {
		return v, fmt.Errorf("verify the publication: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return v, fmt.Errorf("parse pg_current_wal_lsn %q: %w", lsnText, err)
	}
	v.LSN = LSN(lsn)
	if oid == nil {
		return v, fmt.Errorf("%w: publication %q no longer exists: the stream cannot go on without it; create it again with outbox-cdc init", ErrOutboxChanged, o.Publication)
	}
	v.PublicationOID = *oid
	return v, nil
}

// publishedFacts are what VerifyOutbox reads of one table.
type publishedFacts struct {
	oid, pubOID                  *uint32
	kind, tables, inSchemas      *string
	insert, viaRoot, all, member bool
	children                     []string
}

// verification judges the facts of table o.
func (f publishedFacts) verification(o Outbox) (Verification, error) {
	var v Verification
	lost := "rows inserted since are not in the stream; once fixed, rows still in the table can be replayed with `outbox-cdc resync`"
	switch {
	case f.oid == nil:
		return v, fmt.Errorf("%w: outbox table %s no longer exists (dropped or renamed); %s", ErrOutboxChanged, o, lost)
	case len(f.children) > 0:
		return v, fmt.Errorf("%w: %s; %s", ErrOutboxChanged, inheritanceError(o, f.children), lost)
	case f.pubOID == nil:
		return v, fmt.Errorf("%w: publication %q no longer exists; %s", ErrOutboxChanged, o.Publication, lost)
	case !f.insert:
		return v, fmt.Errorf("%w: publication %q no longer publishes inserts: ALTER PUBLICATION %s SET (publish = 'insert'); %s",
			ErrOutboxChanged, o.Publication, pgx.Identifier{o.Publication}.Sanitize(), lost)
	case !f.member:
		return v, fmt.Errorf("%w: outbox table %s is no longer in publication %q (removed, or dropped and re-created): ALTER PUBLICATION %s ADD TABLE %s; %s",
			ErrOutboxChanged, o, o.Publication, pgx.Identifier{o.Publication}.Sanitize(), o.qualified(), lost)
	case f.kind != nil && *f.kind == "p" && !f.viaRoot:
		return v, fmt.Errorf("%w: publication %q stopped publishing via the partition root, so the partitioned outbox's rows arrive under other names: ALTER PUBLICATION %s SET (publish_via_partition_root = true); %s",
			ErrOutboxChanged, o.Publication, pgx.Identifier{o.Publication}.Sanitize(), lost)
	}
	v.TableOID, v.PublicationOID = *f.oid, *f.pubOID
	if f.all {
		v.Membership = append(v.Membership, "all")
	}
	for _, list := range []*string{f.tables, f.inSchemas} {
		if list != nil {
			v.Membership = append(v.Membership, strings.Split(*list, ",")...)
		}
	}
	slices.Sort(v.Membership)
	return v, nil
}

// inheritanceError says why an outbox with inheritance children cannot be streamed.
func inheritanceError(o Outbox, children []string) string {
	return fmt.Sprintf("outbox table %s has inheritance children (%s): a publication of the table includes them, and their rows arrive under their own names, "+
		"so rows inserted into them (by a partitioning trigger, say) would never be delivered. Use declarative partitioning (PARTITION BY, published via the partition root), "+
		"or detach them (ALTER TABLE <child> NO INHERIT %s)", o, strings.Join(children, ", "), o.qualified())
}

// SlotState is a replication slot as pg_replication_slots shows it: the one description of a slot
// that set-up, the slot monitor and `status` share.
type SlotState struct {
	// Name is the slot's name; Exists is false when there is no such slot (the other fields are then
	// zero, except the resync marker's).
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	// Database is the database a logical slot belongs to; Plugin its output plugin; Type
	// "logical" or "physical".
	Database string `json:"database,omitempty"`
	Plugin   string `json:"plugin,omitempty"`
	Type     string `json:"type,omitempty"`
	// Active reports whether a walsender streams from it, and ActivePID which process (0 when
	// inactive).
	Active    bool `json:"active"`
	ActivePID int  `json:"active_pid,omitempty"`
	// WALStatus is reserved, extended, unreserved or lost.
	WALStatus string `json:"wal_status,omitempty"`
	// ConfirmedFlush is confirmed_flush_lsn; RestartLSN is restart_lsn, the oldest WAL kept for it.
	ConfirmedFlush LSN `json:"confirmed_flush_lsn"`
	RestartLSN     LSN `json:"restart_lsn"`
	// LagBytes is pg_current_wal_lsn() minus confirmed_flush_lsn: the WAL the slot has not released;
	// WALHeldBytes is pg_current_wal_lsn() minus restart_lsn: the WAL kept on disk for it.
	LagBytes     int64 `json:"lag_bytes"`
	WALHeldBytes int64 `json:"wal_held_bytes"`
	// InactiveSeconds is how long the slot has been inactive, from inactive_since (PostgreSQL 17 and
	// later); -1 when unknown or active.
	InactiveSeconds float64 `json:"inactive_seconds"`
	// InvalidationReason says why the slot was invalidated (PostgreSQL 17 and later: wal_removed,
	// rows_removed, wal_level_insufficient, and on 18 idle_timeout); empty while it is usable.
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	// Failover is true for a failover slot, synchronized to standbys (PostgreSQL 17 and later).
	Failover bool `json:"failover"`
	// ResyncMarker is true while the marker of an unfinished resync of the slot exists, and
	// ResyncRunning while a resync process holds the slot's resync lock.
	ResyncMarker  bool `json:"resync_marker"`
	ResyncRunning bool `json:"resync_running"`
	// currentDatabase is the database of the connection that read the state.
	currentDatabase string
}

// Slot reads the slot's state, whichever database it belongs to.
func (c *Catalog) Slot(ctx context.Context, slot string) (SlotState, error) {
	s := SlotState{Name: slot, InactiveSeconds: -1}
	version, err := c.serverVersion(ctx)
	if err != nil {
		return s, err
	}
	inactive, invalidation, failover := "-1::float8", "NULL::text", "false"
	if version >= 170000 {
		inactive = "coalesce(extract(epoch FROM now() - s.inactive_since), -1)::float8"
		invalidation, failover = "s.invalidation_reason", "s.failover"
	}
	var db, plugin *string
	var pid *int
	var walStatus, confirmed, restart, reason *string
	err = c.conn.QueryRow(ctx, `SELECT current_database(), s.slot_type, s.database, s.plugin, s.active, s.active_pid, s.wal_status,
		s.confirmed_flush_lsn::text, s.restart_lsn::text,
		coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, 0), coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, 0), `+inactive+`,
		`+invalidation+`, `+failover+`, EXISTS (SELECT FROM pg_replication_slots m WHERE m.slot_name = $2)
		FROM pg_replication_slots s WHERE s.slot_name = $1`, slot, ResyncMarker(slot)).
		Scan(&s.currentDatabase, &s.Type, &db, &plugin, &s.Active, &pid, &walStatus, &confirmed, &restart,
			&s.LagBytes, &s.WALHeldBytes, &s.InactiveSeconds, &reason, &s.Failover, &s.ResyncMarker)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := c.conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, ResyncMarker(slot)).Scan(&s.ResyncMarker); err != nil {
			return s, fmt.Errorf("look up resync marker of slot %q: %w", slot, err)
		}
	} else if err != nil {
		return s, fmt.Errorf("inspect replication slot %q: %w", slot, err)
	} else {
		s.Exists = true
		s.Database, s.Plugin, s.ActivePID, s.WALStatus, s.InvalidationReason = deref(db), deref(plugin), deref(pid), deref(walStatus), deref(reason)
		if s.ConfirmedFlush, err = parseLSN(confirmed); err != nil {
			return s, err
		}
		if s.RestartLSN, err = parseLSN(restart); err != nil {
			return s, err
		}
	}
	if s.ResyncMarker {
		if s.ResyncRunning, err = c.resyncRunning(ctx, slot); err != nil {
			return s, err
		}
	}
	return s, nil
}

// parseLSN parses a nullable LSN in text form (NULL is 0).
func parseLSN(text *string) (LSN, error) {
	if text == nil {
		return 0, nil
	}
	lsn, err := pglogrepl.ParseLSN(*text)
	if err != nil {
		return 0, fmt.Errorf("parse LSN %q: %w", *text, err)
	}
	return LSN(lsn), nil
}

// WantFailover resolves postgres.failover_slot for this server: auto is on from PostgreSQL 17; on
// fails (wrapping ErrNotSetUp) before 17, which has no failover slots.
func (c *Catalog) WantFailover(ctx context.Context, setting string) (bool, error) {
	version, err := c.serverVersion(ctx)
	if err != nil {
		return false, err
	}
	switch setting {
	case "on":
		if version < 170000 {
			return false, fmt.Errorf("%w: postgres.failover_slot is on, but PostgreSQL %d has no failover slots (17 and later do): set it to auto or off", ErrNotSetUp, version/10000)
		}
		return true, nil
	case "off":
		return false, nil
	default:
		return version >= 170000, nil
	}
}

// serverVersion returns server_version_num, read once per connection.
func (c *Catalog) serverVersion(ctx context.Context) (int, error) {
	if c.version == 0 {
		if err := c.conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&c.version); err != nil {
			return 0, fmt.Errorf("read server_version_num: %w", err)
		}
	}
	return c.version, nil
}

// usable says why the slot cannot be streamed from, or nil.
func (s SlotState) usable(name string) error {
	switch {
	case s.Type != "logical":
		return fmt.Errorf("%w: replication slot %q is a %s slot; outbox-cdc needs a logical slot: choose another postgres.slot", ErrNotSetUp, name, s.Type)
	case s.Database != s.currentDatabase:
		return fmt.Errorf("%w: replication slot %q belongs to database %q, not %q: choose another postgres.slot", ErrNotSetUp, name, s.Database, s.currentDatabase)
	case s.Plugin != "pgoutput":
		return fmt.Errorf("%w: replication slot %q uses plugin %q; outbox-cdc needs pgoutput: choose another postgres.slot", ErrNotSetUp, name, s.Plugin)
	case s.WALStatus == "lost":
		return fmt.Errorf("%w: slot %q has wal_status 'lost' (WAL it needed was removed, max_slot_wal_keep_size); events committed since %s may be gone from the WAL: recover with `outbox-cdc resync`", ErrSlotLost, name, s.ConfirmedFlush)
	case s.InvalidationReason != "":
		return fmt.Errorf("%w: slot %q was invalidated (%s; on PostgreSQL 18 idle_timeout means it stayed inactive longer than idle_replication_slot_timeout); events committed since %s may be gone from the WAL: recover with `outbox-cdc resync`",
			ErrSlotLost, name, s.InvalidationReason, s.ConfirmedFlush)
	case s.ResyncRunning:
		return fmt.Errorf("%w: a resync of slot %q is publishing its snapshot", ErrSlotInUse, name)
	case s.ResyncMarker:
		return fmt.Errorf("%w: slot %q starts at a snapshot whose rows were not all published (marker slot %q exists): run `outbox-cdc resync` again; to accept the gap instead, drop the marker with SELECT pg_drop_replication_slot('%s')",
			ErrResyncInterrupted, name, ResyncMarker(name), ResyncMarker(name))
	case s.Active:
		return fmt.Errorf("%w: slot %q is active for pid %d", ErrSlotInUse, name, s.ActivePID)
	}
	return nil
}

// TerminateSlotHolder ends the walsender with pid if it still holds slot: a session of this process
// whose connection died without the server noticing (a half-open socket) would otherwise keep the
// slot until wal_sender_timeout. It reports whether it ended one.
func (c *Catalog) TerminateSlotHolder(ctx context.Context, slot string, pid int) (bool, error) {
	var done bool
	err := c.conn.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(active_pid)), false) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid = $2`, slot, pid).Scan(&done)
	if err != nil {
		return false, fmt.Errorf("end the previous session (pid %d) on slot %q: %w", pid, slot, err)
	}
	return done, nil
}

// DropSlot drops the slot. It fails, wrapping ErrSlotInUse, if a process streams from it.
func (c *Catalog) DropSlot(ctx context.Context, slot string) error {
	if _, err := c.conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return fmt.Errorf("%w: drop slot %q: %s", ErrSlotInUse, slot, pgErr.Message)
		}
		return fmt.Errorf("drop replication slot %q: %w", slot, err)
	}
	return nil
}

// ErrResyncInterrupted is returned (wrapped) when a resync of the slot started and did not finish
// publishing its snapshot: streaming now would skip the snapshot rows not yet published.
var ErrResyncInterrupted = errors.New("a resync of this slot was interrupted")

// ResyncMarker names the marker of an unfinished resync of slot: a physical slot that reserves no WAL,
// created before the snapshot and dropped once every snapshot row is acknowledged.
func ResyncMarker(slot string) string { return slot + "_resync" }

// CreateResyncMarker creates the marker of a resync of slot (idempotent).
func (c *Catalog) CreateResyncMarker(ctx context.Context, slot string) error {
	_, err := c.conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, false)`, ResyncMarker(slot))
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") {
		return fmt.Errorf("create resync marker slot %q: %w", ResyncMarker(slot), err)
	}
	return nil
}

// DropResyncMarker drops the marker of a resync of slot, if it exists.
func (c *Catalog) DropResyncMarker(ctx context.Context, slot string) error {
	_, err := c.conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, ResyncMarker(slot))
	if err != nil {
		return fmt.Errorf("drop resync marker slot %q: %w", ResyncMarker(slot), err)
	}
	return nil
}

// resyncLockKey is the advisory lock a running resync of slot holds on its snapshot connection.
const resyncLockKey = `hashtextextended('outbox-cdc resync ' || $1, 0)`

// LockResync takes the slot's resync lock for the life of this connection: a router waits while it
// is held instead of refusing the marker, and a second resync of the same slot is refused.
func (c *Catalog) LockResync(ctx context.Context, slot string) error {
	var ok bool
	if err := c.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+resyncLockKey+`)`, slot).Scan(&ok); err != nil {
		return fmt.Errorf("take the resync lock of slot %q: %w", slot, err)
	}
	if !ok {
		return fmt.Errorf("%w: another resync of slot %q is running", ErrSlotInUse, slot)
	}
	return nil
}

// resyncRunning reports whether a resync process holds the slot's resync lock.
func (c *Catalog) resyncRunning(ctx context.Context, slot string) (bool, error) {
	var free bool
	if err := c.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+resyncLockKey+`)`, slot).Scan(&free); err != nil {
		return false, fmt.Errorf("check the resync lock of slot %q: %w", slot, err)
	}
	if free {
		if _, err := c.conn.Exec(ctx, `SELECT pg_advisory_unlock(`+resyncLockKey+`)`, slot); err != nil {
			return false, fmt.Errorf("release the resync lock of slot %q: %w", slot, err)
		}
	}
	return !free, nil
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
