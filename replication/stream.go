// Package replication reads committed outbox inserts from PostgreSQL's WAL through a logical
// replication slot (pgoutput) and confirms positions back to the server. It knows nothing of Kafka:
// it hands each row to a Handler and asks the checkpoint tracker which position is safe to confirm.
package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
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
	Deliver(ctx context.Context, tx *checkpoint.Tx, row Row) error
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
	// ServerWALEnd is the latest server WAL end reported by the server.
	ServerWALEnd atomic.Uint64
	// ConfirmedLSN is the latest position confirmed to the server.
	ConfirmedLSN atomic.Uint64
}

// Stream is one replication session on the slot. It is not safe for concurrent use.
type Stream struct {
	conn     *pgconn.PgConn
	opts     Options
	log      *slog.Logger
	types    *pgtype.Map
	rels     map[uint32]*relation
	counters *Counters

	tracker *checkpoint.Tracker
	current *checkpoint.Tx // the transaction being received, nil between transactions

	// wait bounds blocking (a receive, a wait for in-flight room) to receiveWait; one context serves
	// every message until it expires, rather than one timer per message.
	wait       context.Context
	cancelWait context.CancelFunc
	lastSent   time.Time
	sentLSN    LSN
}

// Options configure a Stream.
type Options struct {
	// Slot and Publication name the replication slot and the publication.
	Slot, Publication string
	// Schema and Table name the outbox table.
	Schema, Table string
	// StatusInterval is the longest time between two standby status updates (default 10 s).
	StatusInterval time.Duration
	// Logger receives the stream's log lines.
	Logger *slog.Logger
	// Counters, if not nil, are updated as the stream runs.
	Counters *Counters
}

// ErrSlotInUse is returned (wrapped) when another process streams from the slot (SQLSTATE 55006).
var ErrSlotInUse = errors.New("replication slot is in use by another process")

// ErrSlotLost is returned (wrapped) when the slot has been invalidated and can no longer stream.
var ErrSlotLost = errors.New("replication slot is lost")

// Start opens a replication session on an existing slot: it reads the slot's confirmed position and
// issues START_REPLICATION (pgoutput, proto_version 2, streaming off). The returned stream owns conn.
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
	slot, err := inspectSlot(ctx, conn, opts.Slot)
	if err != nil {
		return nil, err
	}
	if !slot.exists {
		return nil, fmt.Errorf("%w: replication slot %q does not exist (set postgres.create_slot or run outbox-cdc resync)", ErrNotSetUp, opts.Slot)
	}
	if slot.walStatus == "lost" {
		return nil, fmt.Errorf("%w: slot %q has wal_status 'lost' (WAL it needed was removed, max_slot_wal_keep_size); events committed since %s may be gone from the WAL: recover with `outbox-cdc resync`", ErrSlotLost, opts.Slot, slot.confirmed)
	}
	if slot.active {
		return nil, fmt.Errorf("%w: slot %q is active for pid %d", ErrSlotInUse, opts.Slot, slot.activePID)
	}
	if interrupted, err := resyncMarkerExists(ctx, conn, opts.Slot); err != nil {
		return nil, err
	} else if interrupted {
		return nil, fmt.Errorf("%w: slot %q starts at a snapshot whose rows were not all published (marker slot %q exists): run `outbox-cdc resync` again; to accept the gap instead, drop the marker with SELECT pg_drop_replication_slot('%s')",
			ErrResyncInterrupted, opts.Slot, ResyncMarker(opts.Slot), ResyncMarker(opts.Slot))
	}
	args := []string{"proto_version '2'", "publication_names '" + strings.ReplaceAll(opts.Publication, "'", "''") + "'"}
	// Start from the slot's confirmed position (0 means "where the slot is").
	if err := pglogrepl.StartReplication(ctx, conn, quoteIdent(opts.Slot), 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return nil, fmt.Errorf("%w: %s", ErrSlotInUse, pgErr.Message)
		}
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && strings.Contains(pgErr.Message, "can no longer get changes") {
			return nil, fmt.Errorf("%w: %s: recover with `outbox-cdc resync`", ErrSlotLost, pgErr.Message)
		}
		return nil, fmt.Errorf("start replication on slot %q: %w", opts.Slot, err)
	}
	s := &Stream{
		conn:     conn,
		opts:     opts,
		log:      opts.Logger,
		types:    pgtype.NewMap(),
		rels:     make(map[uint32]*relation),
		counters: opts.Counters,
		sentLSN:  slot.confirmed,
		lastSent: time.Now(),
	}
	s.counters.ConfirmedLSN.Store(uint64(slot.confirmed))
	return s, nil
}

// StartLSN is the slot's confirmed position when the stream started; a tracker for this stream must
// start there.
func (s *Stream) StartLSN() LSN { return s.sentLSN }

// Run receives the WAL until ctx ends or an error occurs, handing outbox rows to h and confirming the
// tracker's watermark: within a second after it moves, at once when the server asks, and at least
// every StatusInterval. It returns ctx's error when ctx ends. The tracker must have been created at
// StartLSN and be used by this stream only.
func (s *Stream) Run(ctx context.Context, tr *checkpoint.Tracker, h Handler) error {
	s.tracker = tr
	defer func() {
		if s.cancelWait != nil {
			s.cancelWait()
		}
	}()
	for {
		if err := s.maybeSendStatus(false); err != nil {
			return err
		}
		msg, err := s.conn.ReceiveMessage(s.waitContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive from replication connection: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, h, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("replication stream: server ended the stream (CopyDone)")
		default:
			s.log.Debug("unexpected replication message", "type", fmt.Sprintf("%T", msg))
		}
	}
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
	msg, err := pglogrepl.ParseV2(xld.WALData, false)
	if err != nil {
		return fmt.Errorf("decode pgoutput message at %s: %w", LSN(xld.WALStart), err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessageV2:
		// Replace the cached entry: columns may have been added, dropped or retyped.
		s.rels[m.RelationID] = &relation{
			namespace: m.Namespace,
			name:      m.RelationName,
			columns:   m.Columns,
			outbox:    m.Namespace == s.opts.Schema && m.RelationName == s.opts.Table,
		}
	case *pglogrepl.BeginMessage:
		if s.current != nil {
			return fmt.Errorf("replication stream: Begin of xid %d inside an unfinished transaction", m.Xid)
		}
		s.current = s.tracker.Begin(m.CommitTime)
	case *pglogrepl.InsertMessageV2:
		rel, err := s.relation(m.RelationID)
		if err != nil {
			return err
		}
		if !rel.outbox {
			s.counters.IgnoredOtherTables.Add(1)
			return nil
		}
		if s.current == nil {
			return errors.New("replication stream: insert outside a transaction")
		}
		row, err := decodeTuple(s.types, rel, m.Tuple, LSN(xld.WALStart))
		if err != nil {
			return fmt.Errorf("decode outbox row at %s: %w", LSN(xld.WALStart), err)
		}
		s.counters.Rows.Add(1)
		return s.deliver(ctx, h, row)
	case *pglogrepl.UpdateMessageV2:
		s.countIgnored(m.RelationID, &s.counters.IgnoredUpdates)
	case *pglogrepl.DeleteMessageV2:
		s.countIgnored(m.RelationID, &s.counters.IgnoredDeletes)
	case *pglogrepl.TruncateMessageV2:
		for _, id := range m.RelationIDs {
			s.countIgnored(id, &s.counters.IgnoredTruncates)
		}
	case *pglogrepl.CommitMessage:
		if s.current == nil {
			return errors.New("replication stream: Commit without Begin")
		}
		s.tracker.Commit(s.current, LSN(m.TransactionEndLSN))
		s.current = nil
		s.counters.Transactions.Add(1)
	default:
		// Type, Origin and logical decoding messages carry nothing for the outbox.
	}
	return nil
}

func (s *Stream) relation(id uint32) (*relation, error) {
	rel, ok := s.rels[id]
	if !ok {
		return nil, fmt.Errorf("replication stream: change for relation %d before its Relation message", id)
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

// deliver hands the row to h, answering the server while h waits for capacity. While it waits the
// stream reads no WAL: PostgreSQL holds the backlog, and memory stays bounded.
func (s *Stream) deliver(ctx context.Context, h Handler, row Row) error {
	for {
		err := h.Deliver(s.waitContext(ctx), s.current, row)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if err := s.maybeSendStatus(false); err != nil {
			return err
		}
	}
}

// maybeSendStatus sends a standby status update when the watermark moved, when force is set, or
// when StatusInterval has passed since the last one.
func (s *Stream) maybeSendStatus(force bool) error {
	wm := s.tracker.Watermark()
	periodic := time.Since(s.lastSent) >= s.opts.StatusInterval
	if !force && wm == s.sentLSN && !periodic {
		return nil
	}
	// A periodic update while idle asks the server for a keepalive, whose WAL end then releases WAL
	// that other tables' writes added, even if the server would not have sent one on its own soon.
	return s.sendStatus(wm, periodic && !force && s.current == nil && s.tracker.Idle())
}

func (s *Stream) sendStatus(wm LSN, requestReply bool) error {
	if wm == 0 {
		return nil // nothing known yet; never send 0, which the library would echo into every field
	}
	// Write, flush and apply are set explicitly: the server's confirmed_flush_lsn follows flush.
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(wm),
		WALFlushPosition: pglogrepl.LSN(wm),
		WALApplyPosition: pglogrepl.LSN(wm),
		ClientTime:       time.Now(),
		ReplyRequested:   requestReply,
	})
	if err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	if wm != s.sentLSN {
		s.log.Debug("confirmed", "lsn", wm.String())
	}
	s.sentLSN = wm
	s.lastSent = time.Now()
	s.counters.ConfirmedLSN.Store(uint64(wm))
	return nil
}

// Confirm sends a standby status update with the tracker's watermark now; call it once more on a
// graceful stop, after in-flight records have been acknowledged.
func (s *Stream) Confirm() error {
	if s.tracker == nil {
		return nil
	}
	return s.sendStatus(s.tracker.Watermark(), false)
}

// Close closes the replication connection.
func (s *Stream) Close(ctx context.Context) error {
	return s.conn.Close(ctx)
}
