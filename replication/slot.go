// The replication slot as set-up, the monitor and status see it (SlotState), its failover setting,
// and what resync does to it: the marker of an unfinished resync and the lock a running one holds.

package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
