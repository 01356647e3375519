package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// The failover fault (-failover N): instead of the local services' PostgreSQL, a PostgreSQL 17
// primary and a physical standby that synchronizes the router's failover slot
// (sync_replication_slots on the standby, synchronized_standby_slots on the primary). The router and
// the writers use a multi-host URL with target_session_attrs=read-write. Each fault waits until the
// standby's copy of the slot is ready (synced, not temporary), kills the primary (pg_ctl stop -m
// immediate), promotes the standby, and makes a new standby of the new primary on the dead one's port
// (a cold copy: the new primary stops for a moment). The truth at the end is the last primary's
// transaction log: a commit acknowledged by the old primary but never replicated is gone with it (the
// run counts those), and an event in Kafka whose transaction the last primary lacks is a phantom,
// which fails the run.

// clusters is the testenv.TB of the failover run: testenv's cluster helpers report failures through
// it. Fatalf does not return: it panics with a fatalError that runFailover recovers.
type clusters struct{ cleanups []func() }

type fatalError struct{ msg string }

func (c *clusters) Helper()           {}
func (c *clusters) Fatal(args ...any) { panic(fatalError{fmt.Sprint(args...)}) }
func (c *clusters) Fatalf(format string, args ...any) {
	panic(fatalError{fmt.Sprintf(format, args...)})
}
func (c *clusters) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

// close runs the cleanups, last first: the servers stop and their directories go.
func (c *clusters) close() {
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		c.cleanups[i]()
	}
}

// standbySettings are the postgresql.conf lines of every standby of the failover run.
var standbySettings = []string{"sync_replication_slots = on", "hot_standby_feedback = on"}

// startPair starts the PostgreSQL 17 primary and its standby and points the suite at both.
func (s *suite) startPair(ctx context.Context) (err error) {
	defer recoverFatal(&err)
	s.clusters = &clusters{}
	s.primary = testenv.NewClusterOf(s.clusters, "17", "wal_level = logical", "max_wal_senders = 20")
	s.standbys++
	s.standby = s.primary.Standby(s.clusters, fmt.Sprintf("sb%d", s.standbys), standbySettings...)
	if err := s.synchronizeWith(ctx, s.primary.URL, s.standbys); err != nil {
		return err
	}
	s.pgURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write", s.primary.Port, s.standby.Port)
	s.adminURL = s.pgURL
	return nil
}

// synchronizeWith names the standby's physical slot in the primary's synchronized_standby_slots, so
// that the router receives nothing the standby lacks (no phantom events after a promotion).
func (s *suite) synchronizeWith(ctx context.Context, primaryURL string, n int) error {
	conn, err := pgx.Connect(ctx, primaryURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = 'sb%d'", n), "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// failover waits until the standby could take over without losing the slot, kills the primary,
// promotes the standby and gives it a new standby on the old primary's port.
func (s *suite) failover(ctx context.Context) (err error) {
	defer recoverFatal(&err)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ready, why := s.standbyReady(ctx)
		if ready {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby's copy of the slot is not ready after 2 minutes: %s", why)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The fault is dated when the primary is dead, not when inject logged it: every event committed
	// before then (while the standby caught up, and up to the instant of the kill, which an
	// immediate stop takes a few milliseconds to reach) was sent or could have been sent before it,
	// and a replay that sends it again is this failover's doing. No commit returns after the
	// primary's death.
	s.primary.Stop(s.clusters, "immediate")
	s.faultLog[len(s.faultLog)-1].at = time.Now()
	s.standby.Promote(s.clusters)
	// The promoted server inherited synchronized_standby_slots naming its own former slot, which it
	// lacks: logical decoding would wait for it forever. Until its new standby runs it names none.
	conn, err := pgx.Connect(ctx, s.standby.URL)
	if err != nil {
		return fmt.Errorf("connect to the promoted server: %w", err)
	}
	for _, sql := range []string{"ALTER SYSTEM RESET synchronized_standby_slots", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			_ = conn.Close(ctx)
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	_ = conn.Close(ctx)
	s.standbys++
	dead := s.primary.Port
	s.primary = s.standby
	s.standby = s.primary.StandbyOn(s.clusters, dead, fmt.Sprintf("sb%d", s.standbys), standbySettings...)
	return s.synchronizeWith(ctx, s.primary.URL, s.standbys)
}

// standbyReady reports whether the standby has the router's slot synchronized and no longer
// temporary (a temporary synced slot is dropped at promotion), and why not.
func (s *suite) standbyReady(ctx context.Context) (bool, string) {
	if p, err := pgx.Connect(ctx, s.primary.URL); err == nil {
		_, _ = p.Exec(ctx, "SELECT pg_log_standby_snapshot()") // speeds up the first synchronization
		_ = p.Close(ctx)
	}
	conn, err := pgx.Connect(ctx, s.standby.URL)
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close(ctx)
	var synced, temporary bool
	err = conn.QueryRow(ctx, "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = $1", s.slot).Scan(&synced, &temporary)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, "no copy of the slot on the standby yet"
	case err != nil:
		return false, err.Error()
	case !synced || temporary:
		return false, fmt.Sprintf("synced=%t temporary=%t", synced, temporary)
	}
	return true, ""
}

// survivors returns the ids of the transactions the last primary holds.
func (s *suite) survivors(ctx context.Context) (map[string]bool, error) {
	ids := map[string]bool{}
	err := s.admin(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, "SELECT id::text FROM "+s.table+"_txlog")
		if err != nil {
			return err
		}
		list, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, id := range list {
			ids[id] = true
		}
		return err
	})
	return ids, err
}

// recoverFatal turns a clusters.Fatalf panic into err.
func recoverFatal(err *error) {
	if r := recover(); r != nil {
		f, ok := r.(fatalError)
		if !ok {
			panic(r)
		}
		*err = errors.New(f.msg)
	}
}

// failoverKinds are the faults of a failover run.
var failoverKinds = []string{"failover"}
