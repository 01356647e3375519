// The publication verifier's check: one observation that the stream still sees every outbox insert
// (the table exists, is published whole, and by the same catalog rows as before), or, for a source of
// WAL messages only, that its publication is still the same one.

package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

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
