package replication

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-cdc/outbox-cdc/internal/pin"
)

// SnapshotFilter selects snapshot rows. Zero fields select everything.
type SnapshotFilter struct {
	// Since and Until bound the created-at column (Until is exclusive).
	Since, Until time.Time
	// EventTypes and AggregateIDs, when not empty, select only those rows.
	EventTypes, AggregateIDs []string
}

// SnapshotColumns names the columns a snapshot query filters and orders by.
type SnapshotColumns struct {
	// EventType and AggregateID are required; AggregateVersion and CreatedAt may be empty.
	EventType, AggregateID, AggregateVersion, CreatedAt string
	// Read are all the columns the router reads: only their values are converted (bytea to bytes,
	// timestamps to RFC 3339), exactly as the stream converts them.
	Read []string
}

// Snapshot reads outbox rows in one repeatable-read, read-only transaction: the snapshot a slot
// exported at its consistent point, or (for dry runs) a snapshot of now. Rows come in per-aggregate
// order (see Each), so that each Kafka key receives its events in order. It is not safe for
// concurrent use.
type Snapshot struct {
	conn *pgx.Conn
	open bool // the cursor is declared
	// batchBytes is the size of a batch read ahead (see SetBatchBytes).
	batchBytes int64
	// peakBatchBytes is the largest batch read so far, for tests.
	peakBatchBytes int64
}

// DefaultSnapshotBatchBytes is the size of a batch Each reads ahead unless SetBatchBytes says otherwise.
const DefaultSnapshotBatchBytes = 8 << 20

// SetBatchBytes sets the size of the batches Each reads ahead: a batch ends with the row that
// reaches n bytes (or with its 1000th row), so it exceeds n by less than one row. Each holds at most
// three batches. Values below 64 KiB are raised to it.
func (s *Snapshot) SetBatchBytes(n int64) {
	s.batchBytes = max(n, 64<<10)
}

// exportedSnapshotRE is the form of the snapshot names PostgreSQL exports: it is spliced into SET
// TRANSACTION SNAPSHOT, which takes no parameters.
var exportedSnapshotRE = regexp.MustCompile(`^[0-9A-Fa-f-]{1,64}$`)

// OpenSnapshot starts a repeatable-read, read-only transaction on a new connection to t; with a
// non-empty name it imports that exported snapshot (the replication connection that exported it must
// still be open and idle).
func OpenSnapshot(ctx context.Context, t Target, name string) (*Snapshot, error) {
	if name != "" && !exportedSnapshotRE.MatchString(name) {
		return nil, fmt.Errorf("unexpected exported snapshot name %q", name)
	}
	cfg, err := pgx.ParseConfig(t.URL)
	if err != nil {
		return nil, urlError(err)
	}
	if err := t.password(ctx, &cfg.Config); err != nil {
		return nil, err
	}
	pinSessionSettings(cfg.RuntimeParams) // the rows are read in text form
	pinTimers(cfg.RuntimeParams)          // a sort, a lock or a turn may take long
	// Row-level security on the outbox would hide rows from the snapshot without a word (a table
	// with RLS enabled and no policy shows a role that is neither its owner nor BYPASSRLS nothing at
	// all), while the WAL carries every row: off, a query it would affect fails instead, as pg_dump's.
	cfg.RuntimeParams["row_security"] = "off"
	// The rows come in large FETCHes: read the socket in large pieces rather than pgx's 8 KiB.
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, snapshotReadBuffer), w)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect for the snapshot: %w", err)
	}
	if err := turnOffNewerTimers(ctx, conn.PgConn()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	if err := keepStoredBytes(ctx, conn.PgConn()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	stmts := []string{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"}
	if name != "" {
		stmts = append(stmts, "SET TRANSACTION SNAPSHOT '"+name+"'")
	}
	for _, st := range stmts {
		if _, err := conn.Exec(ctx, st); err != nil {
			_ = conn.Close(context.Background())
			return nil, fmt.Errorf("open the snapshot (%s): %w", st, err)
		}
	}
	return &Snapshot{conn: conn, batchBytes: DefaultSnapshotBatchBytes}, nil
}

// Close ends the snapshot's transaction and closes its connection.
func (s *Snapshot) Close(ctx context.Context) error {
	_, err := s.conn.Exec(ctx, "ROLLBACK")
	if cerr := s.conn.Close(ctx); err == nil {
		err = cerr
	}
	return err
}

// where builds the filter's WHERE clause with parameters.
func where(cols SnapshotColumns, f SnapshotFilter) (string, []any, error) {
	return wherePart(cols, f, 0, 1)
}

// wherePart is where for part of parts: the rows whose aggregate hashes to part (every row when parts
// is 1). A NULL aggregate hashes as 0, so that no row falls out of every part.
func wherePart(cols SnapshotColumns, f SnapshotFilter, part, parts int) (string, []any, error) {
	var conds []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, fmt.Sprintf(cond, len(args)))
	}
	if parts > 1 {
		args = append(args, parts, part)
		conds = append(conds, fmt.Sprintf("(coalesce(hashtext(%s::text), 0) & 2147483647) %% $%d = $%d",
			pgx.Identifier{cols.AggregateID}.Sanitize(), len(args)-1, len(args)))
	}
	if (!f.Since.IsZero() || !f.Until.IsZero()) && cols.CreatedAt == "" {
		return "", nil, errors.New("a time filter needs postgres.columns.created_at")
	}
	created := pgx.Identifier{cols.CreatedAt}.Sanitize()
	if !f.Since.IsZero() {
		add(created+" >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		add(created+" < $%d", f.Until)
	}
	if len(f.EventTypes) > 0 {
		add(pgx.Identifier{cols.EventType}.Sanitize()+"::text = ANY($%d::text[])", f.EventTypes)
	}
	if len(f.AggregateIDs) > 0 {
		add(pgx.Identifier{cols.AggregateID}.Sanitize()+"::text = ANY($%d::text[])", f.AggregateIDs)
	}
	if len(conds) == 0 {
		return "", nil, nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args, nil
}

// hiddenRows explains the error of a snapshot query the role may not run over every row: SQLSTATE 42501,
// a missing SELECT privilege or row-level security (row_security is off on snapshot connections, so a
// query it would filter fails instead of skipping rows). The code, not the message, decides: the
// server may write its messages in another language.
func hiddenRows(err error, o Outbox) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("%w: %w: the role may not read every row of the outbox table %s, so a snapshot would miss rows "+
			"that the WAL carries: grant it SELECT on the table and, if the table has row-level security, let it bypass that "+
			"(ALTER ROLE ... BYPASSRLS) or connect as the table's owner", ErrNotSetUp, err, o)
	}
	return err
}

// CheckReadable fails, naming the fix, when the snapshot could not read every row of each table:
// row-level security would hide rows, or the role lacks SELECT. It reads no row.
func (s *Snapshot) CheckReadable(ctx context.Context, tables ...Outbox) error {
	for _, o := range tables {
		if _, err := s.conn.Exec(ctx, "SELECT FROM "+o.qualified()+" LIMIT 0"); err != nil {
			return fmt.Errorf("read the outbox table %s: %w", o, hiddenRows(err, o))
		}
	}
	return nil
}

// Count returns the number of rows of table that the filter selects.
func (s *Snapshot) Count(ctx context.Context, o Outbox, cols SnapshotColumns, f SnapshotFilter) (int64, error) {
	w, args, err := where(cols, f)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := s.conn.QueryRow(ctx, "SELECT count(*) FROM "+o.qualified()+w, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count snapshot rows: %w", hiddenRows(err, o))
	}
	return n, nil
}

// snapshotReadBuffer is the size of the reads from a snapshot connection's socket.
const snapshotReadBuffer = 256 << 10

// snapshotBatchRows is the most rows one batch of Each holds.
const snapshotBatchRows = 1000

// valueOverhead is what a value costs beyond its bytes once read (its slice header).
const valueOverhead = 24

// cursorName names the snapshot cursor.
const cursorName = "outbox_cdc_snapshot"

// Each reads the rows the filter selects in per-aggregate order, decodes them as WAL rows are
// decoded, and calls fn for each. It reads a bounded number of rows at a time (a server-side cursor),
// whatever the table's size.
//
// The order is the one the WAL gives an aggregate's events as far as a table can tell it: by
// aggregate; then its version, where the outbox has one; then by transaction — its commit time where
// track_commit_timestamp is on, else its transaction id, the order in which transactions began to
// write (the commit order whenever the application serializes an aggregate's writers, as a row lock
// on the aggregate does); then created-at; then, within a transaction, by statement (cmin); and last
// by physical position, which is insertion order only within one statement (a multi-row INSERT or
// COPY into reused space may not be). ctid alone is not insertion order once vacuumed space is reused.
//
// Aggregates are grouped by their text in the "C" collation (byte order): any grouping keeps each
// aggregate's events together and in order, and byte order is the cheapest to sort by.
func (s *Snapshot) Each(ctx context.Context, o Outbox, cols SnapshotColumns, f SnapshotFilter, fn func(*Row) error) error {
	return s.eachPart(ctx, o, cols, f, 0, 1, fn)
}

// eachPart is Each for the rows whose aggregate hashes to part of parts.
func (s *Snapshot) eachPart(ctx context.Context, o Outbox, cols SnapshotColumns, f SnapshotFilter, part, parts int, fn func(*Row) error) error {
	// Rows are read and decoded ahead in batches while the ones before are published: PostgreSQL's
	// work on the next rows overlaps the router's. At most three batches are held (one published,
	// one handed over, one being read), each bounded by bytes (SetBatchBytes). When fn fails, the
	// reader drops the rest of the FETCH under way and ends.
	quit, batches := make(chan struct{}), make(chan fetched, 1)
	go s.read(ctx, o, cols, f, part, parts, quit, batches)
	defer func() {
		close(quit)
		for range batches { // the connection is free again once the reader has ended
		}
	}()
	for b := range batches {
		if b.err != nil {
			return b.err
		}
		for i := range b.rows {
			if err := fn(b.rows[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// query declares the snapshot cursor over the rows of part of parts in per-aggregate order (see Each).
func (s *Snapshot) query(ctx context.Context, o Outbox, cols SnapshotColumns, f SnapshotFilter, part, parts int) error {
	w, args, err := wherePart(cols, f, part, parts)
	if err != nil {
		return err
	}
	var commitTimes bool
	if err := s.conn.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp')::bool").Scan(&commitTimes); err != nil {
		return fmt.Errorf("read track_commit_timestamp: %w", err)
	}
	order := []string{pgx.Identifier{cols.AggregateID}.Sanitize() + `::text COLLATE "C"`}
	if cols.AggregateVersion != "" {
		order = append(order, pgx.Identifier{cols.AggregateVersion}.Sanitize())
	}
	if commitTimes {
		order = append(order, "pg_xact_commit_timestamp(xmin) NULLS FIRST") // NULL: committed before it was tracked
	}
	order = append(order, "age(xmin) DESC")
	if cols.CreatedAt != "" {
		order = append(order, pgx.Identifier{cols.CreatedAt}.Sanitize())
	}
	order = append(order, "cmin::text::bigint", "ctid")
	if s.open {
		if _, err := s.conn.Exec(ctx, "CLOSE "+cursorName); err != nil {
			return fmt.Errorf("close snapshot cursor: %w", err)
		}
	}
	if _, err := s.conn.Exec(ctx, "DECLARE "+cursorName+" NO SCROLL CURSOR FOR SELECT * FROM "+o.qualified()+w+" ORDER BY "+strings.Join(order, ", "), args...); err != nil {
		return fmt.Errorf("open snapshot cursor: %w", hiddenRows(err, o))
	}
	s.open = true
	return nil
}

// fetched is a batch of decoded rows read from the cursor, or the error that ended the reading.
type fetched struct {
	rows []*Row
	err  error
}

// columnSize is what a decoded column costs beyond its value's bytes.
const columnSize = int(unsafe.Sizeof(Column{}))

// slab hands out pieces of larger allocations: a row's values, its columns and the Row itself come
// from blocks of slabBytes of values, slabColumns columns and slabRows rows instead of allocations of
// their own (measured on a resync of 2,000,000 rows: a quarter of its CPU went to the garbage
// collector; on the stream at 10,000 events/s, 9 allocations per event became 6). A piece keeps its
// whole block alive as long as anything refers to it, as a record in flight does: each row carries
// its block (Row.Block), which the router charges to the in-flight byte cap once while any of the
// block's records is in flight (package pin). Records are acknowledged about in the order they were
// read, so the charge is close to what the rows take; a few records held long, each from another
// block (a partition that does not acknowledge), count for the blocks they keep alive. Every piece
// of one row comes from one block (fit): a row never keeps two alive. A row whose values are larger
// than slabOwnValues is a block of its own, sized by all its values — those the router forwards and
// those it does not read, which the row keeps alive just the same.
type slab struct {
	bytes []byte
	cols  []Column
	rows  []Row
	block *pin.Block
	// alone is set by fit for a row too large for a block: its pieces are allocated for it alone,
	// and its block is its own.
	alone *pin.Block
}

const (
	slabBytes   = 16 << 10
	slabColumns = 256
	slabRows    = 64
	// slabOwnValues: a row whose values are larger than this is a block of its own.
	slabOwnValues = slabBytes / 4
)

// rowSize is what a Row itself costs in its block.
const rowSize = int(unsafe.Sizeof(Row{}))

// fit makes room for one row of n bytes of values and c columns in the current block, or starts a
// new block, or (more than slabOwnValues bytes) a block for the row alone: the row's pieces (take,
// columns, row) then all come from one block.
func (b *slab) fit(n, c int) {
	b.alone = nil
	if n > slabOwnValues {
		b.alone = pin.NewBlock(int64(n + c*columnSize + rowSize))
		return
	}
	if b.block != nil && cap(b.bytes)-len(b.bytes) >= n && cap(b.cols)-len(b.cols) >= c && len(b.rows) < cap(b.rows) {
		return
	}
	nb, nc, nr := b.next()
	b.bytes = make([]byte, 0, max(nb, n))
	b.cols = make([]Column, 0, max(nc, c))
	b.rows = make([]Row, 0, nr)
	b.block = pin.NewBlock(int64(cap(b.bytes) + cap(b.cols)*columnSize + cap(b.rows)*rowSize))
}

// next sizes a new block by the rows the current one held: as many rows of their shape as fit into
// slabBytes of values, slabColumns columns and slabRows rows, whichever runs out first, with an
// eighth more of the other two for rows that differ. A block of fixed parts left a quarter of
// itself unused with the outbox's typical rows (~720 bytes of values in 8 columns filled the values
// after 22 of 64 rows and 176 of 256 columns); its pieces keep the whole block alive while a record
// is in flight, and the router charges all of it to the in-flight byte cap. The first block, and a
// block after one that held no row, take the defaults.
func (b *slab) next() (bytes, cols, rows int) {
	held := len(b.rows)
	if held == 0 {
		return slabBytes, slabColumns, slabRows
	}
	perBytes, perCols := len(b.bytes)/held, len(b.cols)/held
	fits := slabRows
	if perBytes > 0 {
		fits = min(fits, slabBytes/perBytes)
	}
	if perCols > 0 {
		fits = min(fits, slabColumns/perCols)
	}
	fits = max(fits, 1)
	size := func(per, limit int) int { return min(limit, fits*per+(fits*per+7)/8) }
	return size(perBytes, slabBytes), size(perCols, slabColumns), size(1, slabRows)
}

// take returns n bytes of the block (of their own for more than slabOwnValues).
func (b *slab) take(n int) []byte {
	if n > slabOwnValues || b.alone != nil {
		return make([]byte, n)
	}
	b.fit(n, 0)
	start := len(b.bytes)
	b.bytes = b.bytes[:start+n]
	return b.bytes[start : start+n : start+n]
}

// columns returns n columns of the block.
func (b *slab) columns(n int) []Column {
	if b.alone != nil {
		return make([]Column, n)
	}
	b.fit(0, n)
	start := len(b.cols)
	b.cols = b.cols[:start+n]
	return b.cols[start : start+n : start+n]
}

// row stores r in the block, marked as the block's, and returns it there.
func (b *slab) row(r Row) *Row {
	if b.alone != nil {
		// Its own allocation, made here: returning &r would move every call's r to the heap, an
		// allocation per row the block was meant to save.
		own := new(Row)
		*own = r
		own.block, b.alone = b.alone, nil
		return own
	}
	b.fit(0, 0)
	r.block = b.block
	b.rows = append(b.rows, r)
	return &b.rows[len(b.rows)-1]
}

// read declares the cursor over part of parts and reads it into out (see fetch), which it closes;
// it reports whether it read the part to its end. An error is sent on out unless quit is closed.
func (s *Snapshot) read(ctx context.Context, o Outbox, cols SnapshotColumns, f SnapshotFilter, part, parts int, quit <-chan struct{}, out chan<- fetched) bool {
	defer close(out)
	if err := s.query(ctx, o, cols, f, part, parts); err != nil {
		select {
		case out <- fetched{err: err}:
		case <-quit:
		}
		return false
	}
	return s.fetch(ctx, NewRowDecoder(cols.Read), quit, out)
}

// fetch reads the declared cursor, decodes its rows and sends them to out in batches of at most
// snapshotBatchRows rows and about the snapshot's batch bytes (a batch ends with the row that
// reaches them), until the cursor is exhausted, fails, quit is closed or ctx ends. Each FETCH's rows
// are read one at a time, so memory holds only the batches handed over, whatever a FETCH returns.
// It reports whether it read the cursor to its end.
func (s *Snapshot) fetch(ctx context.Context, decoder *RowDecoder, quit <-chan struct{}, out chan<- fetched) bool {
	send := func(b fetched) bool {
		select {
		case out <- b:
			return true
		case <-quit:
			return false
		}
	}
	pc := s.conn.PgConn()
	var (
		names  []string
		oids   []uint32
		used   []bool
		values [][]byte // one row's values in the slab: decoded into its columns
		space  slab
		batch  []*Row
		size   int64
	)
	for {
		// The simple protocol returns every value in text form, as the WAL carries them. The rows of
		// one FETCH are read one at a time: those not read yet wait in the socket, not here.
		mrr := pc.Exec(ctx, fmt.Sprintf("FETCH FORWARD %d FROM %s", snapshotBatchRows, cursorName))
		stopped, rows := false, 0 // stopped: quit; the rest of this FETCH is read and dropped
		for mrr.NextResult() {
			rr := mrr.ResultReader()
			if names == nil {
				fds := rr.FieldDescriptions()
				names, oids, used = make([]string, len(fds)), make([]uint32, len(fds)), make([]bool, len(fds))
				for i, fd := range fds {
					names[i], oids[i] = fd.Name, fd.DataTypeOID // a domain column is described by its base type
					used[i] = decoder.used[fd.Name]
				}
				values = make([][]byte, len(fds))
			}
			for rr.NextRow() {
				if rows++; stopped {
					continue
				}
				raw := rr.Values() // valid until the next row: copied into the slab
				if len(raw) != len(names) {
					stopped = true
					send(fetched{err: fmt.Errorf("read snapshot: a row of %d columns, want %d", len(raw), len(names))})
					continue
				}
				n := 0
				for _, v := range raw {
					n += len(v)
				}
				space.fit(n, len(names)) // the row's values, columns and itself in one block
				buf := space.take(n)
				n = 0
				for i, v := range raw {
					values[i] = nil // nil is NULL
					if v != nil {
						values[i] = buf[n : n+len(v) : n+len(v)]
						n += copy(buf[n:], v)
					}
				}
				batch = append(batch, space.row(decoder.decodeInto(space.columns(len(names)), names, used, oids, values)))
				size += int64(n + columnSize*len(raw))
				if size >= s.batchBytes || len(batch) >= snapshotBatchRows {
					s.peakBatchBytes = max(s.peakBatchBytes, size)
					stopped = !send(fetched{rows: batch})
					batch, size = make([]*Row, 0, len(batch)), 0
				}
			}
			_, _ = rr.Close() // its error is mrr's too
		}
		err := mrr.Close()
		switch {
		case stopped:
			return false
		case err != nil:
			send(fetched{err: fmt.Errorf("read snapshot: %w", err)})
			return false
		case rows == 0:
			if len(batch) > 0 {
				s.peakBatchBytes = max(s.peakBatchBytes, size)
				return send(fetched{rows: batch})
			}
			return true
		}
	}
}

// EachInParts is Each over several snapshot connections that share one exported snapshot: the rows
// are split into parts by a hash of their aggregate (every aggregate's events in one part, in
// order), and part i+1 is read — PostgreSQL sorts it — on the next connection while part i is handed
// to fn. fn receives part 0's rows, then part 1's, and so on, on the caller's goroutine. With one
// part it is Each. After an error the snapshots may be unusable (a read cut short closes its
// connection): close them. Each connection holds what Each holds: at most three batches of decoded
// rows (one being read, one handed over, one with fn).
func EachInParts(ctx context.Context, snaps []*Snapshot, o Outbox, cols SnapshotColumns, f SnapshotFilter, parts int, fn func(*Row) error) error {
	if len(snaps) == 0 {
		return errors.New("EachInParts without a snapshot")
	}
	if parts <= 1 {
		return snaps[0].Each(ctx, o, cols, f, fn)
	}
	ctx, cancel := context.WithCancel(ctx)
	// One channel per part; the connections take the parts in turn (part i on connection i mod n),
	// each one part after the other, so a connection starts its next part once fn has had the last.
	outs := make([]chan fetched, parts)
	for i := range outs {
		outs[i] = make(chan fetched, 1)
	}
	var wg sync.WaitGroup
	for c, snap := range snaps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for part := c; part < parts; part += len(snaps) {
				if !snap.read(ctx, o, cols, f, part, parts, ctx.Done(), outs[part]) {
					return
				}
			}
		}()
	}
	defer func() {
		cancel()
		wg.Wait() // every reader ends, its connection free again
	}()
	for part := range parts {
		for done := false; !done; {
			select {
			case b, ok := <-outs[part]:
				switch {
				case !ok:
					// A part cut short by the end of ctx is closed without an error: say so.
					if err := ctx.Err(); err != nil {
						return err
					}
					done = true
				case b.err != nil:
					return b.err
				default:
					for i := range b.rows {
						if err := fn(b.rows[i]); err != nil {
							return err
						}
					}
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}
