// What the stream tells the server: the standby status updates that confirm the slot (the
// watermark held at the last verified position), the answers to keepalives while a call waits for
// Kafka (block, unblock), and the end of the stream. Every write is bounded (statusTimeout).

package replication

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// block and unblock enclose a call that may wait for Kafka: a wait for in-flight room, or a Batcher's
// call (a commit waits for the one before it), each up to kafka.ack_timeout. The stream reads nothing meanwhile, so the server's keepalive
// requests go unanswered: answerWhileBlocked sends status updates for it, so that a walsender whose
// wal_sender_timeout is shorter than the wait does not end the connection. The stream's fields are
// the other goroutine's only between the two; blockMu hands them back.
func (s *Stream) block() { s.blockedSince.Store(time.Now().UnixNano()) }

// unblock ends what block began; see block.
func (s *Stream) unblock() {
	s.blockedSince.Store(0)
	s.blockMu.Lock() // an update being sent for the call finishes first
	s.blockMu.Unlock()
}

// answerWhileBlocked sends a status update whenever none went out for half a receiveWait while a
// call under block runs, until stop is closed: the server hears from the stream at least every
// receiveWait. A failed write closes the connection (write), which the stream then finds.
func (s *Stream) answerWhileBlocked(stop <-chan struct{}) {
	every := s.receiveWait() / 2
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		since := s.blockedSince.Load()
		if since == 0 {
			continue
		}
		s.blockMu.Lock()
		if s.blockedSince.Load() == since && time.Since(s.lastSent) >= every {
			if err := s.maybeSendStatus(true); err != nil {
				s.log.Debug("status update while waiting for Kafka failed", "error", err.Error())
			}
		}
		s.blockMu.Unlock()
	}
}

// maybeSendStatus sends a standby status update when the watermark moved, when force is set, or
// when StatusInterval has passed since the last one.
func (s *Stream) maybeSendStatus(force bool) error {
	wm := s.confirmable()
	periodic := time.Since(s.lastSent) >= s.opts.StatusInterval
	if !force && wm == s.sentLSN && !periodic {
		return nil
	}
	// A periodic update while idle asks the server for a keepalive, whose WAL end then releases WAL
	// that other tables' writes added, even if the server would not have sent one on its own soon.
	// One after a silence asks the server to prove it is still there.
	idle := s.current == nil && s.tracker.Idle()
	return s.sendStatus(wm, periodic && !force && (idle || time.Since(s.heard) >= s.opts.StatusInterval))
}

// confirmable is the position a status update may confirm: the watermark, held at the last position
// where the outbox was verified to be published, and never behind what was already confirmed.
func (s *Stream) confirmable() LSN {
	wm := s.tracker.Watermark()
	if s.opts.ConfirmLimit != nil {
		wm = min(wm, s.opts.ConfirmLimit())
	}
	return max(wm, s.sentLSN)
}

// statusTimeout bounds every write to the server (a status update, the end of the stream): a
// connection whose send buffer stays full that long is dead, and a peer that stops reading must not
// hold the stream until TCP gives up.
const statusTimeout = 10 * time.Second

// write runs send, a write to the server, bounded by writeTimeout through the socket's write deadline
// (pglogrepl ignores the context of its writes). A write that failed may have sent part of a message,
// so the connection is closed: nothing more can be sent on it.
func (s *Stream) write(what string, send func() error) error {
	nc := s.conn.Conn()
	if err := nc.SetWriteDeadline(time.Now().Add(s.writeTimeout)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := send(); err != nil {
		_ = nc.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("%s: the server read nothing for %s: the connection is presumed dead: %w", what, s.writeTimeout, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := nc.SetWriteDeadline(time.Time{}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (s *Stream) sendStatus(wm LSN, requestReply bool) error {
	if wm == 0 {
		return nil // nothing known yet; never send 0, which the library would echo into every field
	}
	// Write, flush and apply are set explicitly: the server's confirmed_flush_lsn follows flush.
	err := s.write("send standby status update", func() error {
		return pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pglogrepl.LSN(wm),
			WALFlushPosition: pglogrepl.LSN(wm),
			WALApplyPosition: pglogrepl.LSN(wm),
			ClientTime:       time.Now(),
			ReplyRequested:   requestReply,
		})
	})
	if err != nil {
		return err
	}
	if wm != s.sentLSN {
		s.log.Debug("confirmed", "lsn", wm.String())
	}
	s.sentLSN = wm
	s.lastSent = time.Now()
	s.counters.ConfirmedLSN.Store(uint64(wm))
	return nil
}

// Confirm sends a standby status update with the confirmable position now; call it once more on a
// graceful stop, after in-flight records have been acknowledged (and the outbox verified again).
func (s *Stream) Confirm() error {
	if s.tracker == nil {
		return nil
	}
	if s.conn.IsClosed() {
		// pgconn closed it after a network error and is still sending Terminate from its own
		// goroutine: nothing more can be sent, and writing now would race with that goroutine.
		return errors.New("confirm: the replication connection is closed")
	}
	return s.sendStatus(s.confirmable(), false)
}

// Finish ends the stream after a graceful stop: it sends the final status update, then CopyDone, and
// waits (bounded by ctx) for the server to end the stream, which it does only after processing every
// message before CopyDone — so that when Finish returns, the final confirm is applied, not merely
// written to a socket that closes right after.
func (s *Stream) Finish(ctx context.Context) error {
	if err := s.Confirm(); err != nil {
		return err
	}
	if err := s.write("end the replication stream", func() error {
		s.conn.Frontend().Send(&pgproto3.CopyDone{})
		return s.conn.Frontend().Flush()
	}); err != nil {
		return err
	}
	for {
		msg, err := s.conn.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("end the replication stream: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("end the replication stream: %w", pgconn.ErrorResponseToPgError(m))
		}
	}
}
