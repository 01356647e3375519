package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrUnlistedTable is returned (wrapped, with ErrOutboxChanged or ErrNotSetUp) when the publication
// publishes inserts into a table that is neither one of the source's outbox tables nor listed under
// postgres.ignore_tables. Its rows may be outbox events an instance with a newer configuration must
// deliver (a table added in a rolling update), so they are never dropped and confirmed past: the
// stream stops before them, and set-up refuses such a publication.
var ErrUnlistedTable = errors.New("the publication publishes a table the configuration does not list")

// IgnoredTables are published tables whose inserts are not for this router (postgres.ignore_tables):
// schema-qualified names, or "*" for every table other than the outbox tables. Their rows are counted
// and dropped; every other table's rows stop the stream (ErrUnlistedTable).
type IgnoredTables []string

// IgnoreAll is the IgnoredTables entry that ignores every table other than the outbox tables.
const IgnoreAll = "*"

// Has reports whether the table schema.table is ignored.
func (t IgnoredTables) Has(schema, table string) bool {
	for _, name := range t {
		if name == IgnoreAll {
			return true
		}
		if s, n := SplitTable(name); s == schema && n == table {
			return true
		}
	}
	return false
}

// unlistedTableError is the stream's stop at the first insert into table, a table of the publication
// that is neither an outbox table nor ignored: at is the commit position of its transaction.
func unlistedTableError(o Options, table Outbox, at LSN) error {
	return fmt.Errorf("%w: %w: the transaction committing at WAL position %s carries an insert into %s (publication %q), which is not one of this source's outbox tables (postgres.table, tables) nor listed under postgres.ignore_tables. "+
		"Its rows are never dropped: nothing from this transaction on was confirmed, so an instance with the right configuration delivers them. "+
		"If %s is an outbox of this source, add it to tables and restart (or let the instances that have it take over); if its rows are not for this router, list it under postgres.ignore_tables; "+
		"a table removed from the publication (ALTER PUBLICATION %s DROP TABLE %s) still sends the rows written before the removal",
		ErrOutboxChanged, ErrUnlistedTable, at, table, o.Outbox.Publication, table, pgx.Identifier{o.Outbox.Publication}.Sanitize(), table.qualified())
}

// unlistedTables refuses a publication that publishes tables the source neither streams nor ignores
// (SetupOptions.Ignore): their inserts would stop the stream at the first one. all is the
// publication's FOR ALL TABLES.
func (c *Catalog) unlistedTables(ctx context.Context, o SetupOptions, all bool) error {
	rows, err := c.conn.Query(ctx, `SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`, o.Outbox.Publication)
	if err != nil {
		return fmt.Errorf("read the tables of publication %q: %w", o.Outbox.Publication, err)
	}
	published, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Outbox, error) {
		var t Outbox
		err := r.Scan(&t.Schema, &t.Table)
		return t, err
	})
	if err != nil {
		return fmt.Errorf("read the tables of publication %q: %w", o.Outbox.Publication, err)
	}
	tables := o.tables()
	var extra []string
	for _, t := range published {
		listed := slices.ContainsFunc(tables, func(x Outbox) bool { return x.Schema == t.Schema && x.Table == t.Table })
		if !listed && !o.Ignore.Has(t.Schema, t.Table) {
			extra = append(extra, t.String())
		}
	}
	if len(extra) == 0 {
		return nil
	}
	const shown = 10
	names := strings.Join(extra[:min(len(extra), shown)], ", ")
	if len(extra) > shown {
		names += fmt.Sprintf(" and %d more", len(extra)-shown)
	}
	how := ""
	if all {
		how = " (it is FOR ALL TABLES: give the outbox a publication of its own, or set postgres.ignore_tables to [\"*\"])"
	}
	pub := pgx.Identifier{o.Outbox.Publication}.Sanitize()
	return fmt.Errorf("%w: %w: %w: publication %q also publishes %s%s, which this source neither streams (postgres.table, tables) nor ignores (postgres.ignore_tables): "+
		"the stream would stop at their first insert rather than drop it. Add the outbox tables among them to tables; list the tables whose rows are not for this router under postgres.ignore_tables; "+
		"or remove them from the publication (ALTER PUBLICATION %s DROP TABLE <table>; rows written before the removal still arrive)",
		ErrNotSetUp, ErrPending, ErrUnlistedTable, o.Outbox.Publication, names, how, pub)
}
