// Set-up's view of the outbox tables and their publication: each table's facts, the publication
// checked or created (whole tables, via the partition root, generated columns), and the rows a new
// slot or table will not stream.

package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

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
