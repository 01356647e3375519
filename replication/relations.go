// The tables a stream reads: which configured table a Relation message names, whether its columns
// still hold what the router reads, the base types of domain columns, and the count of changes it
// passes over.

package replication

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// tableIndex returns which outbox table schema.table is (0 for Options.Outbox, i+1 for
// Options.Tables[i]), and false when it is none of them.
func (s *Stream) tableIndex(schema, table string) (int, bool) {
	if schema == s.opts.Outbox.Schema && table == s.opts.Outbox.Table {
		return 0, true
	}
	for i, t := range s.opts.Tables {
		if schema == t.Schema && table == t.Table {
			return i + 1, true
		}
	}
	return 0, false
}

// checkColumns checks a Relation message of the outbox against the columns the router reads. A
// required column missing (dropped, renamed, or left out of the publication's column list) would turn
// every later row into a record without its key, type or value: the stream stops before any of them
// is produced, naming the column and the fix.
func (s *Stream) checkColumns(rel *relation, at LSN) error {
	table := Outbox{Schema: rel.namespace, Table: rel.name}
	for _, role := range s.opts.Columns {
		if slices.ContainsFunc(rel.columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == role.Column }) {
			delete(s.gone, MissingColumn{Table: rel.table, Column: role.Column})
			continue
		}
		if role.Required {
			return fmt.Errorf("%w: from WAL position %s on, the outbox %s has no column %q (%s): it was dropped or renamed, or the publication's column list leaves it out, or it became a generated column (not published before PostgreSQL 18). "+
				"Restore the column (or its name), or publish it (ALTER PUBLICATION %s SET TABLE %s), or point %s at its new name; nothing past this position was confirmed",
				ErrOutboxChanged, at, table, role.Column, role.Key, pgx.Identifier{s.opts.Outbox.Publication}.Sanitize(), table.qualified(), role.Key)
		}
		if g := (MissingColumn{Table: rel.table, Column: role.Column}); !s.gone[g] {
			s.gone[g] = true
			s.log.Warn("the outbox's columns changed: an optional column is gone, records go without it",
				"table", table.String(), "column", role.Column, "key", role.Key, "lsn", at.String())
		}
	}
	return nil
}

// firstUserOID is PostgreSQL's FirstNormalObjectId: types below it are built in.
const firstUserOID = 16384

// columnTypes fills the outbox relation's per-column base types and which columns the router reads.
func (s *Stream) columnTypes(ctx context.Context, rel *relation) error {
	rel.types = make([]uint32, len(rel.columns))
	rel.used = make([]bool, len(rel.columns))
	for i, c := range rel.columns {
		rel.types[i], rel.used[i] = c.DataType, s.used[c.Name]
		if !rel.used[i] || c.DataType < firstUserOID || s.opts.BaseType == nil {
			continue
		}
		base, ok := s.bases[c.DataType]
		if !ok {
			var err error
			if base, err = s.opts.BaseType(ctx, c.DataType); err != nil {
				return fmt.Errorf("look up the type of outbox column %s: %w", c.Name, err)
			}
			s.bases[c.DataType] = base
		}
		rel.types[i] = base
	}
	return nil
}

func (s *Stream) relation(id uint32) (*relation, error) {
	rel, ok := s.rels[id]
	if !ok {
		return nil, fmt.Errorf("%w: change for relation %d before its Relation message", ErrUnreadable, id)
	}
	return rel, nil
}

func (s *Stream) countIgnored(id uint32, outboxCounter *atomic.Int64) {
	if rel, ok := s.rels[id]; ok && rel.outbox {
		outboxCounter.Add(1)
		return
	}
	s.counters.IgnoredOtherTables.Add(1)
}
