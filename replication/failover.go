package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// PrimaryFailover is what a primary says about its slots surviving a failover.
type PrimaryFailover struct {
	// ServerVersion is server_version_num; failover slots exist from 170000.
	ServerVersion int `json:"server_version"`
	// SynchronizedStandbySlots is the synchronized_standby_slots setting (17+), split into names.
	SynchronizedStandbySlots []string `json:"synchronized_standby_slots"`
	// MissingStandbySlots are the names in it with no physical slot on this server: logical decoding
	// of failover slots waits for them forever (only a server WARNING says why).
	MissingStandbySlots []string `json:"missing_standby_slots,omitempty"`
	// PhysicalSlots are this server's physical slots and the position each one's standby flushed.
	PhysicalSlots map[string]LSN `json:"physical_slots,omitempty"`
}

// FailoverSupported reports whether the server has failover slots (PostgreSQL 17 and later).
func (p PrimaryFailover) FailoverSupported() bool { return p.ServerVersion >= 170000 }

// PrimaryFailover reads the primary's side of failover readiness.
func (c *Catalog) PrimaryFailover(ctx context.Context) (PrimaryFailover, error) {
	var p PrimaryFailover
	var err error
	if p.ServerVersion, err = c.serverVersion(ctx); err != nil {
		return p, err
	}
	rows, err := c.conn.Query(ctx, "SELECT slot_name::text, COALESCE(restart_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_type = 'physical'")
	if err != nil {
		return p, fmt.Errorf("read physical slots: %w", err)
	}
	p.PhysicalSlots = map[string]LSN{}
	for rows.Next() {
		var name, lsn string
		if err := rows.Scan(&name, &lsn); err != nil {
			rows.Close()
			return p, fmt.Errorf("read physical slots: %w", err)
		}
		l, _ := pglogrepl.ParseLSN(lsn)
		p.PhysicalSlots[name] = LSN(l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("read physical slots: %w", err)
	}
	if !p.FailoverSupported() {
		return p, nil
	}
	var setting string
	if err := c.conn.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&setting); err != nil {
		return p, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	p.SynchronizedStandbySlots = splitSlotList(setting)
	for _, name := range p.SynchronizedStandbySlots {
		if _, ok := p.PhysicalSlots[name]; !ok && name != "*" {
			p.MissingStandbySlots = append(p.MissingStandbySlots, name)
		}
	}
	return p, nil
}

// splitSlotList splits a list setting such as synchronized_standby_slots: comma-separated names,
// optionally double-quoted.
func splitSlotList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if len(part) >= 2 && part[0] == '"' && part[len(part)-1] == '"' {
			part = strings.ReplaceAll(part[1:len(part)-1], `""`, `"`)
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// StandbyFailover is what a standby says about taking over the slot at a failover.
type StandbyFailover struct {
	// ServerVersion is server_version_num; InRecovery is false on a server that is not a standby.
	ServerVersion int  `json:"server_version"`
	InRecovery    bool `json:"in_recovery"`
	// The standby's settings for slot synchronization (17+).
	SyncReplicationSlots       bool   `json:"sync_replication_slots"`
	HotStandbyFeedback         bool   `json:"hot_standby_feedback"`
	PrimarySlotName            string `json:"primary_slot_name"`
	PrimaryConninfoHasDatabase bool   `json:"primary_conninfo_has_dbname"`
	// The slot's copy on the standby: ready for a promotion only when synced and not temporary (a
	// temporary synced slot is dropped at promotion), and not invalidated.
	SlotExists         bool   `json:"slot_exists"`
	SlotSynced         bool   `json:"slot_synced"`
	SlotTemporary      bool   `json:"slot_temporary"`
	SlotInvalidation   string `json:"slot_invalidation,omitempty"`
	SlotConfirmedFlush LSN    `json:"slot_confirmed_flush_lsn"`
}

// StandbyFailover reads a standby's side of failover readiness for slot. It never returns the
// standby's primary_conninfo, which may hold a password; only whether it names a database.
func (c *Catalog) StandbyFailover(ctx context.Context, slot string) (StandbyFailover, error) {
	var s StandbyFailover
	var err error
	if s.ServerVersion, err = c.serverVersion(ctx); err != nil {
		return s, err
	}
	if err := c.conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback')::bool, current_setting('primary_slot_name')").Scan(
		&s.InRecovery, &s.HotStandbyFeedback, &s.PrimarySlotName); err != nil {
		return s, fmt.Errorf("read standby settings: %w", err)
	}
	if s.ServerVersion < 170000 {
		return s, nil
	}
	var conninfo string
	if err := c.conn.QueryRow(ctx, "SELECT current_setting('sync_replication_slots')::bool, current_setting('primary_conninfo')").Scan(&s.SyncReplicationSlots, &conninfo); err != nil {
		return s, fmt.Errorf("read standby settings: %w", err)
	}
	s.PrimaryConninfoHasDatabase = ConninfoHasDatabase(conninfo)
	var confirmed, invalidation *string
	err = c.conn.QueryRow(ctx, "SELECT synced, temporary, confirmed_flush_lsn::text, invalidation_reason FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(
		&s.SlotSynced, &s.SlotTemporary, &confirmed, &invalidation)
	switch {
	case err == nil:
		s.SlotExists = true
		if confirmed != nil {
			l, _ := pglogrepl.ParseLSN(*confirmed)
			s.SlotConfirmedFlush = LSN(l)
		}
		if invalidation != nil {
			s.SlotInvalidation = *invalidation
		}
	case errors.Is(err, pgx.ErrNoRows):
	default:
		return s, fmt.Errorf("read slot %s on the standby: %w", slot, err)
	}
	return s, nil
}

// ConninfoHasDatabase reports whether a libpq connection string (key=value or URL) names a database.
func ConninfoHasDatabase(conninfo string) bool {
	if strings.HasPrefix(conninfo, "postgres://") || strings.HasPrefix(conninfo, "postgresql://") {
		rest := conninfo[strings.Index(conninfo, "://")+3:]
		if i := strings.IndexAny(rest, "/"); i >= 0 {
			db := rest[i+1:]
			if q := strings.IndexByte(db, '?'); q >= 0 {
				return q > 0 || strings.Contains(db[q:], "dbname=")
			}
			return db != ""
		}
		return strings.Contains(rest, "dbname=")
	}
	for _, f := range strings.Fields(conninfo) {
		if strings.HasPrefix(f, "dbname=") && len(f) > len("dbname=") {
			return true
		}
	}
	return false
}
