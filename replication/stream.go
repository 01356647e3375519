// Package replication is outbox-cdc's only conversation with PostgreSQL. Stream reads committed
// outbox inserts from the WAL through a logical replication slot (pgoutput) and confirms positions
// back to the server; Catalog, an ordinary connection, asks everything else — set-up checks and DDL,
// the slot's state, the outbox's publication check, the facts `init` and `status` report, resync's
// marker and lock; Snapshot reads the rows of an exported snapshot for resync. It knows nothing of
// Kafka: the stream hands each row to a Handler and asks the checkpoint tracker which position is
// safe to confirm.
package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// LSN is a WAL position.
type LSN = checkpoint.LSN

// Handler receives outbox rows in commit order.
type Handler interface {
	// Deliver hands one row of tx to the router. It may block while the router is at its in-flight
	// cap; it must then return ctx's error when ctx ends, without having taken the row, so that the
	// stream can answer the server and call again.
	// The row lives in the stream's memory blocks (Row.Block): the handler may keep it, and what it
	// refers to, as long as it needs.
	Deliver(ctx context.Context, tx *checkpoint.Tx, row *Row) error
}

// Batcher is a Handler that groups whole transactions into larger units before they count as
// delivered (the exactly-once mode's Kafka transactions). The stream tells it where each
// transaction ends, and calls Flush between transactions, never inside one, once FlushDue has come.
type Batcher interface {
	Handler
	// Committed is told that tx committed at end (CommitMessage.TransactionEndLSN), after every row
	// of tx was handed to Deliver. Transactions without outbox rows are reported too.
	Committed(ctx context.Context, tx *checkpoint.Tx, end LSN) error
	// FlushDue is when Flush should next run; zero when there is nothing to flush.
	FlushDue() time.Time
	// Flush ends the current unit; it runs between transactions only.
	Flush(ctx context.Context) error
}

// Counters count what the stream decoded and ignored. All fields are safe for concurrent reads.
type Counters struct {
	// Rows counts decoded outbox inserts.
	Rows atomic.Int64
	// Transactions counts committed transactions received.
	Transactions atomic.Int64
	// IgnoredUpdates, IgnoredDeletes and IgnoredTruncates count outbox operations that are not inserts.
	IgnoredUpdates, IgnoredDeletes, IgnoredTruncates atomic.Int64
	// IgnoredOtherTables counts changes to tables other than the outbox.
	IgnoredOtherTables atomic.Int64
	// Messages counts logical decoding messages of Options.MessagePrefixes; IgnoredMessages those of
	// other prefixes.
	Messages, IgnoredMessages atomic.Int64
	// ServerWALEnd is the latest server WAL end reported by the server.
	ServerWALEnd atomic.Uint64
	// ConfirmedLSN is the latest position confirmed to the server.
	ConfirmedLSN atomic.Uint64
	// LastMessage is when the latest message arrived from the server (Unix nanoseconds).
	LastMessage atomic.Int64
}

// Stream is one replication session on the slot. It is not safe for concurrent use.
type Stream struct {
	// messages turns outbox messages into Rows (message.go).
	messages messageReader
	// passedOver holds the prefixes of the messages passed over that were reported (at most
	// maxReportedPrefixes).
	passedOver map[string]bool
	conn       *pgconn.PgConn
	opts       Options
	log        *slog.Logger
	types      *pgtype.Map
	rels       map[uint32]*relation
	used       map[string]bool   // the columns the router reads (Options.Columns)
	bases      map[uint32]uint32 // BaseType's answers
	// gone holds the optional columns the stream reported missing (by table index and column), so
	// that a Relation message sent again with the same columns (PostgreSQL resends it after any
	// invalidation of the table's cache entry, an autoanalyze among them) does not repeat the warning.
	gone     map[MissingColumn]bool
	tuple    []tupleColumn // scratch for parseInsert, reused row after row
	space    slab          // the rows' values, columns and Rows: carved from blocks, not allocated per row
	counters *Counters

	tracker *checkpoint.Tracker
	current *checkpoint.Tx // the transaction being received, nil between transactions

	// wait bounds blocking (a receive, a wait for in-flight room) to receiveWait; one context serves
	// every message until it expires, rather than one timer per message.
	wait       context.Context
	cancelWait context.CancelFunc
	// readDeadline is the read deadline set on the socket (see receive).
	readDeadline time.Time
	lastSent     time.Time
	sentLSN      LSN
	// writeTimeout bounds every write to the server (statusTimeout).
	writeTimeout time.Duration
	// heard is when the server was last heard from, or when the stream last went back to listening
	// after a wait for in-flight room (it reads nothing meanwhile, so silence then proves nothing).
	heard time.Time
	// blockedSince is when the wait for Kafka the stream is in began (UnixNano; zero outside one), and
	// blockMu is held while answerWhileBlocked sends a status update for it (see block).
	blockedSince atomic.Int64
	blockMu      sync.Mutex
}

// Options configure a Stream.
type Options struct {
	// Slot names the replication slot.
	Slot string
	// Outbox names the outbox table and the publication.
	Outbox Outbox
	// Tables are further outbox tables of the same publication (their Publication is ignored): a row
	// of Tables[i] arrives with Row.Table i+1, a row of Outbox with 0.
	Tables []Outbox
	// Columns are the columns the router reads: every Relation message of the outbox is checked
	// against them, and a missing required column stops the stream before anything past it is
	// confirmed.
	Columns []ColumnRole
	// StartLSN is the slot's confirmed position (SetupResult.Slot.ConfirmedFlush); the stream
	// resumes there and its tracker must start there.
	StartLSN LSN
	// StatusInterval is the longest time between two standby status updates (default 10 s).
	StatusInterval time.Duration
	// ReceiveTimeout is the longest silence from the server before the connection is presumed dead
	// (a half-open socket accepts writes for minutes); zero disables the check. The stream asks the
	// server for a keepalive when it has heard nothing for StatusInterval, so a live server is never
	// silent for long.
	ReceiveTimeout time.Duration
	// ConfirmLimit, if not nil, returns the highest position that may be confirmed regardless of the
	// watermark: the last WAL position at which the outbox was verified to be published.
	ConfirmLimit func() LSN
	// BaseType, if not nil, returns the base type of a type that is not built in (a domain's base
	// type, through domains over domains; any other type itself), so that a domain over bytea or
	// timestamptz is decoded as one. It is asked once per type and stream, when a Relation message of
	// the outbox names one for a column the router reads; an error ends the stream (and the session is
	// retried). Nil takes every type as itself.
	BaseType func(ctx context.Context, oid uint32) (uint32, error)
	// Missing are the optional columns set-up found missing and warned of (SetupResult.Missing): a
	// Relation message without them is no change to warn of again.
	Missing []MissingColumn
	// MessagePrefixes, when not empty, are the prefixes of the logical decoding messages that carry
	// outbox events (message.go): the stream asks the server for messages, and each one under these
	// prefixes reaches the handler as a Row of Options.Outbox (Row.Table 0).
	MessagePrefixes []string
	// Ignore are the published tables whose inserts are not for this router (postgres.ignore_tables):
	// they are counted and dropped. An insert into any other table that is not an outbox table stops
	// the stream before its transaction is confirmed (ErrUnlistedTable).
	Ignore IgnoredTables
	// Logger receives the stream's log lines.
	Logger *slog.Logger
	// Counters, if not nil, are updated as the stream runs.
	Counters *Counters
}

// ErrSlotInUse is returned (wrapped) when another process streams from the slot (SQLSTATE 55006).
var ErrSlotInUse = errors.New("replication slot is in use by another process")

// ErrSlotLost is returned (wrapped) when the slot has been invalidated and can no longer stream.
var ErrSlotLost = errors.New("replication slot is lost")

// ErrServerSilent is returned (wrapped) when nothing has arrived from the server for longer than
// ReceiveTimeout: the connection is presumed dead.
var ErrServerSilent = errors.New("the replication connection went silent")

// publicationRE is what a publication name may be (config validates it too): it is spliced into the
// START_REPLICATION command, which takes no parameters.
var publicationRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Start issues START_REPLICATION (pgoutput, proto_version 2, streaming off) on the replication
// connection conn for a slot that Catalog.Setup found usable. The returned stream owns conn.
func Start(ctx context.Context, conn *pgconn.PgConn, opts Options) (*Stream, error) {
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Counters == nil {
		opts.Counters = new(Counters)
	}
	if !publicationRE.MatchString(opts.Outbox.Publication) {
		return nil, fmt.Errorf("%w: publication name %q is not lower-case letters, digits and underscores", ErrNotSetUp, opts.Outbox.Publication)
	}
	args := []string{"proto_version '2'", "publication_names '" + opts.Outbox.Publication + "'"}
	if len(opts.MessagePrefixes) > 0 || serverMajor(conn) >= 14 {
		// The prefixes are never sent: the server sends every message and the stream picks. Asked
		// for even without prefixes (PostgreSQL 14+), so that a message passed over is counted and
		// reported, never dropped in silence: an application emitting outbox events before the
		// router is configured for their prefix is told of.
		args = append(args, "messages 'true'")
	}
	// Start from the slot's confirmed position (0 means "where the slot is").
	if err := pglogrepl.StartReplication(ctx, conn, pgx.Identifier{opts.Slot}.Sanitize(), 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return nil, fmt.Errorf("%w: %s", ErrSlotInUse, pgErr.Message)
		}
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && strings.Contains(pgErr.Message, "can no longer get changes") {
			return nil, fmt.Errorf("%w: %s: recover with `outbox-cdc resync`", ErrSlotLost, pgErr.Message)
		}
		if errors.As(err, &pgErr) && missingPublication(pgErr) {
			return nil, serverError(pgErr, opts)
		}
		return nil, fmt.Errorf("start replication on slot %q: %w", opts.Slot, err)
	}
	s := newStream(conn, opts)
	return s, nil
}

// newStream is the stream of a replication connection on which START_REPLICATION succeeded, with
// Start's defaults applied to opts.
func newStream(conn *pgconn.PgConn, opts Options) *Stream {
	now := time.Now()
	s := &Stream{
		conn:         conn,
		opts:         opts,
		log:          opts.Logger,
		types:        pgtype.NewMap(),
		rels:         make(map[uint32]*relation),
		used:         make(map[string]bool, len(opts.Columns)),
		bases:        make(map[uint32]uint32),
		gone:         make(map[MissingColumn]bool, len(opts.Missing)),
		counters:     opts.Counters,
		sentLSN:      opts.StartLSN,
		lastSent:     now,
		heard:        now,
		writeTimeout: statusTimeout,
	}
	for _, c := range opts.Columns {
		s.used[c.Column] = true
	}
	for _, m := range opts.Missing {
		s.gone[m] = true
	}
	s.counters.ConfirmedLSN.Store(uint64(opts.StartLSN))
	return s
}

// Run receives the WAL until ctx ends or an error occurs, handing outbox rows to h and confirming the
// tracker's watermark: within a second after it moves, at once when the server asks, and at least
// every StatusInterval. It returns ctx's error when ctx ends. The tracker must have been created at
// Options.StartLSN and be used by this stream only.
func (s *Stream) Run(ctx context.Context, tr *checkpoint.Tracker, h Handler) error {
	s.tracker = tr
	release := s.interruptReads(ctx)
	defer func() {
		release()
		if s.cancelWait != nil {
			s.cancelWait()
		}
	}()
	batcher, _ := h.(Batcher)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.answerWhileBlocked(stop)
	}()
	defer func() { close(stop); wg.Wait() }() // before the stream may be closed
	for {
		if batcher != nil && s.current == nil {
			if due := batcher.FlushDue(); !due.IsZero() && !time.Now().Before(due) {
				s.block()
				err := batcher.Flush(ctx)
				s.unblock()
				if err != nil {
					return err
				}
			}
		}
		if err := s.maybeSendStatus(false); err != nil {
			return err
		}
		deadline, _ := s.waitContext(ctx).Deadline()
		if batcher != nil && s.current == nil {
			if due := batcher.FlushDue(); !due.IsZero() && due.Before(deadline) {
				deadline = due // so that the batcher's Flush is not late
			}
		}
		msg, err := s.receive(ctx, deadline)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if silent := time.Since(s.heard); s.opts.ReceiveTimeout > 0 && silent > s.opts.ReceiveTimeout {
					return fmt.Errorf("%w: nothing received for %s (postgres.receive_timeout %s), though a keepalive was asked for: the connection is presumed dead",
						ErrServerSilent, silent.Round(time.Second), s.opts.ReceiveTimeout)
				}
				continue
			}
			return fmt.Errorf("receive from replication connection: %w", err)
		}
		s.heard = time.Now()
		s.counters.LastMessage.Store(s.heard.UnixNano())
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, h, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return serverError(pgconn.ErrorResponseToPgError(msg), s.opts)
		case *pgproto3.CopyDone:
			return errors.New("replication stream: server ended the stream (CopyDone)")
		default:
			s.log.Debug("unexpected replication message", "type", fmt.Sprintf("%T", msg))
		}
	}
}

// missingPublication reports the walsender's error for a publication that does not exist at the
// position it decodes: SQLSTATE 42704 raised while pgoutput decodes (its context names the output
// plugin), or one whose message names a publication. The server may write its messages in another
// language (lc_messages), so the context, not the text, is what is relied on; the plugin's name is
// never translated.
func missingPublication(err *pgconn.PgError) bool {
	return err.Code == "42704" && (strings.Contains(err.Where, `"pgoutput"`) || strings.Contains(err.Message, "publication"))
}

// serverError is an error the server ended the stream with. One that a replay meets again — the
// publication missing at the slot's position, because it was dropped (and maybe created again) after
// the slot — wraps ErrOutboxChanged and points at resync.
func serverError(err *pgconn.PgError, opts Options) error {
	if missingPublication(err) {
		return fmt.Errorf("%w: the server cannot decode the slot's WAL with publication %q (%s): it was dropped, and maybe created again, after slot %q was created, "+
			"so it does not exist at the slot's position. Every session would fail the same way: recover with `outbox-cdc resync`, which creates the slot anew and republishes the rows still in the outbox",
			ErrOutboxChanged, opts.Outbox.Publication, err.Message, opts.Slot)
	}
	return fmt.Errorf("replication stream: %w", err)
}

// waitContext returns the current wait context, starting a new one of receiveWait when the last one
// expired.
func (s *Stream) waitContext(ctx context.Context) context.Context {
	if s.wait == nil || s.wait.Err() != nil {
		if s.cancelWait != nil {
			s.cancelWait()
		}
		s.wait, s.cancelWait = context.WithTimeout(ctx, s.receiveWait())
	}
	return s.wait
}

// receive reads the next message from the server, waiting until deadline at most. It gives pgconn
// no context: pgconn would watch one per message (a context.AfterFunc registered and removed on every
// message, a few percent of the stream's CPU under load). The socket's read deadline bounds the wait
// instead, set only when it changes, and interruptReads ends a read when Run's context ends.
func (s *Stream) receive(ctx context.Context, deadline time.Time) (pgproto3.BackendMessage, error) {
	if !deadline.Equal(s.readDeadline) {
		if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
			return nil, fmt.Errorf("receive from replication connection: set the read deadline: %w", err)
		}
		s.readDeadline = deadline
	}
	// Checked after the deadline is set: a context that ends from now on interrupts the read (its
	// interrupt sets the deadline after this one), and one that ended before is seen here.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.conn.ReceiveMessage(context.Background())
}

// interruptReads makes the end of ctx end a receive in progress (by moving the socket's read deadline
// to now) until release is called. release waits for an interrupt under way and clears the read
// deadline, so that later reads on the connection (Finish's) are not cut short.
func (s *Stream) interruptReads(ctx context.Context) (release func()) {
	nc := s.conn.Conn()
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = nc.SetReadDeadline(time.Now()) // an error: the connection is closed, and reads fail anyway
		close(interrupted)
	})
	return func() {
		if !stop() {
			<-interrupted
		}
		_ = nc.SetReadDeadline(time.Time{})
		s.readDeadline = time.Time{}
	}
}

// receiveWait is how long one receive may block: short enough to confirm a moved watermark within
// a second.
func (s *Stream) receiveWait() time.Duration {
	return min(time.Second, s.opts.StatusInterval)
}

func (s *Stream) handleCopyData(ctx context.Context, h Handler, data []byte) error {
	if len(data) == 0 {
		return errors.New("replication stream: empty CopyData message")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		s.counters.ServerWALEnd.Store(uint64(pkm.ServerWALEnd))
		// With nothing in flight and no transaction half-received, everything up to the server's WAL
		// end is either delivered or not ours: confirm it so that an idle outbox does not pin WAL.
		if s.current == nil {
			s.tracker.AdvanceIdle(LSN(pkm.ServerWALEnd))
		}
		return s.maybeSendStatus(pkm.ReplyRequested)
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		return s.handleWAL(ctx, h, xld)
	default:
		s.log.Debug("unknown CopyData message", "byte", string(data[0]))
		return nil
	}
}

func (s *Stream) handleWAL(ctx context.Context, h Handler, xld pglogrepl.XLogData) error {
	data := xld.WALData
	if len(data) > 0 {
		// The per-row messages are parsed by hand (pgoutput.go); the rest with pglogrepl.
		switch pglogrepl.MessageType(data[0]) {
		case pglogrepl.MessageTypeInsert:
			return s.handleInsert(ctx, h, xld)
		case pglogrepl.MessageTypeUpdate, pglogrepl.MessageTypeDelete:
			id, err := relationOf(data)
			if err != nil {
				return fmt.Errorf("%w: decode pgoutput message at %s: %w", ErrUnreadable, LSN(xld.WALStart), err)
			}
			if data[0] == byte(pglogrepl.MessageTypeUpdate) {
				s.countIgnored(id, &s.counters.IgnoredUpdates)
			} else {
				s.countIgnored(id, &s.counters.IgnoredDeletes)
			}
			return nil
		}
	}
	msg, err := parseMessage(data)
	if err != nil {
		return fmt.Errorf("%w: decode pgoutput message at %s: %w", ErrUnreadable, LSN(xld.WALStart), err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessageV2:
		// Replace the cached entry: columns may have been added, dropped or retyped. A partitioned
		// outbox's rows arrive under its own name (the publication publishes via the partition root).
		rel := &relation{
			namespace: m.Namespace,
			name:      m.RelationName,
			columns:   m.Columns,
		}
		rel.table, rel.outbox = s.tableIndex(m.Namespace, m.RelationName)
		if rel.outbox {
			at := LSN(xld.WALStart) // zero for a Relation message: the transaction's commit position then
			if at == 0 && s.current != nil {
				at = LSN(s.current.CommitLSN())
			}
			if err := s.checkColumns(rel, at); err != nil {
				return err
			}
			if err := s.columnTypes(ctx, rel); err != nil {
				return err
			}
		}
		s.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		if s.current != nil {
			return fmt.Errorf("%w: Begin of xid %d at %s inside an unfinished transaction", ErrUnreadable, m.Xid, LSN(xld.WALStart))
		}
		s.current = s.tracker.BeginSent(m.CommitTime, xld.ServerTime, LSN(m.FinalLSN))
	case *pglogrepl.TruncateMessageV2:
		for _, id := range m.RelationIDs {
			s.countIgnored(id, &s.counters.IgnoredTruncates)
		}
	case *pglogrepl.LogicalDecodingMessageV2:
		return s.handleMessage(ctx, h, &m.LogicalDecodingMessage, xld)
	case *pglogrepl.LogicalDecodingMessage:
		return s.handleMessage(ctx, h, m, xld)
	case *pglogrepl.CommitMessage:
		if s.current == nil {
			return fmt.Errorf("%w: Commit without Begin at %s", ErrUnreadable, LSN(xld.WALStart))
		}
		tx := s.current
		s.tracker.Commit(tx, LSN(m.TransactionEndLSN))
		s.current = nil
		s.counters.Transactions.Add(1)
		if b, ok := h.(Batcher); ok {
			s.block()
			defer s.unblock()
			return b.Committed(ctx, tx, LSN(m.TransactionEndLSN))
		}
	default:
		// Type and Origin messages carry nothing for the outbox.
	}
	return nil
}

// handleInsert decodes an Insert and hands an outbox row to the handler; inserts into ignored tables
// (Options.Ignore) are counted and dropped before their values are copied, and an insert into any
// other table stops the stream (ErrUnlistedTable).
func (s *Stream) handleInsert(ctx context.Context, h Handler, xld pglogrepl.XLogData) error {
	id, err := relationOf(xld.WALData)
	if err != nil {
		return fmt.Errorf("%w: decode pgoutput message at %s: %w", ErrUnreadable, LSN(xld.WALStart), err)
	}
	rel, err := s.relation(id)
	if err != nil {
		return err
	}
	if !rel.outbox {
		if !s.opts.Ignore.Has(rel.namespace, rel.name) {
			// Maybe an outbox of a newer configuration (a table added in a rolling update): its rows
			// must reach an instance that has it, so nothing from here on is confirmed.
			at := LSN(xld.WALStart)
			if s.current != nil {
				at = LSN(s.current.CommitLSN())
			}
			return unlistedTableError(s.opts, Outbox{Schema: rel.namespace, Table: rel.name}, at)
		}
		s.counters.IgnoredOtherTables.Add(1)
		return nil
	}
	if s.current == nil {
		return fmt.Errorf("%w: insert outside a transaction at %s", ErrUnreadable, LSN(xld.WALStart))
	}
	// The row's values, columns and the Row itself come from one block of s.space.
	s.space.fit(len(xld.WALData)-8, len(rel.columns))
	_, s.tuple, err = parseInsert(xld.WALData, s.tuple, &s.space)
	if err != nil {
		return fmt.Errorf("%w: decode outbox row at %s: %w", ErrUnreadable, LSN(xld.WALStart), err)
	}
	row, err := decodeTuple(s.types, rel, s.tuple, s.space.columns, LSN(xld.WALStart))
	if err != nil {
		return fmt.Errorf("decode outbox row at %s: %w", LSN(xld.WALStart), err)
	}
	s.counters.Rows.Add(1)
	return s.deliver(ctx, h, s.space.row(row))
}

// deliver hands the row to h, answering the server while h waits for capacity. While it waits the
// stream reads no WAL: PostgreSQL holds the backlog, and memory stays bounded.
func (s *Stream) deliver(ctx context.Context, h Handler, row *Row) error {
	for waited := false; ; waited = true {
		err := h.Deliver(s.waitContext(ctx), s.current, row)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			err = ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// The router waits for room (Kafka slow or away, up to kafka.ack_timeout). The stream
			// reads nothing meanwhile, so the server's keepalive requests go unanswered:
			// answerWhileBlocked answers for it, so that a walsender whose wal_sender_timeout is
			// shorter than the wait does not end the connection.
			if !waited {
				s.block()
			}
			continue
		}
		if waited {
			s.unblock()
			s.heard = time.Now() // the stream read nothing while it waited
		}
		return err
	}
}

// BackendPID is the server process of the replication connection: the walsender that holds the slot.
func (s *Stream) BackendPID() int { return int(s.conn.PID()) }

// Server is the address of the server the stream reads from (host:port), which with a multi-host
// postgres.url says which host is the primary now.
func (s *Stream) Server() string {
	if nc := s.conn.Conn(); nc != nil && nc.RemoteAddr() != nil {
		return nc.RemoteAddr().String()
	}
	return ""
}

// Close closes the replication connection. Its goodbye to the server is bounded by ctx and by
// statusTimeout, so that a peer that stopped reading cannot hold it.
func (s *Stream) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.writeTimeout)
	defer cancel()
	return s.conn.Close(ctx)
}
