package pipeline

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// SlotStatus is the slot as pg_replication_slots shows it, polled every slotPollInterval.
type SlotStatus struct {
	// Known is false until the first successful poll, and when the slot does not exist.
	Known bool
	// Exists reports whether the slot exists.
	Exists bool
	// Active reports whether a walsender streams from the slot (this instance or another).
	Active bool
	// WALStatus is reserved, extended, unreserved or lost.
	WALStatus string
	// LagBytes is pg_current_wal_lsn() minus confirmed_flush_lsn.
	LagBytes int64
}

// Snapshot is a consistent-enough view of the pipeline for metrics and health checks.
type Snapshot struct {
	// State is what the pipeline is doing.
	State State
	// Replication counters.
	Rows, Transactions, IgnoredUpdates, IgnoredDeletes, IgnoredTruncates, IgnoredOtherTables int64
	// Router counters.
	Produced, ProducedBytes, DeadLettered, InFlightRecords, InFlightBytes int64
	// ConfirmedLSN is the last position confirmed to the server; ServerWALEnd the server's last WAL end.
	ConfirmedLSN, ServerWALEnd uint64
	// SecondsBehind is now minus the commit time of the oldest unacknowledged transaction; 0 when idle.
	SecondsBehind float64
	// Restarts counts sessions rebuilt after a failure.
	Restarts int64
	// Errors counts failures by class: postgres, kafka, undeliverable.
	Errors map[string]int64
	// Slot is the latest poll of pg_replication_slots.
	Slot SlotStatus
	// LastVerified is when the outbox was last verified to be published (zero before the first
	// session); confirms never pass the position of that check.
	LastVerified time.Time
}

// observed is the pipeline's mutable state read by Snapshot.
type observed struct {
	mu       sync.Mutex
	tracker  *checkpoint.Tracker
	restarts int64
	errors   map[string]int64
	slot     SlotStatus
	verified time.Time
}

func (o *observed) markVerified(at time.Time) {
	o.mu.Lock()
	o.verified = at
	o.mu.Unlock()
}

func (o *observed) setTracker(tr *checkpoint.Tracker) {
	o.mu.Lock()
	o.tracker = tr
	o.mu.Unlock()
}

func (o *observed) countError(class string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.errors == nil {
		o.errors = map[string]int64{}
	}
	o.errors[class]++
	o.restarts++
}

// errorClass names the part of the system an error came from, for the errors metric.
func errorClass(err error) string {
	var undeliverable *router.UndeliverableError
	var kafka *kafkaError
	switch {
	case errors.As(err, &undeliverable):
		return "undeliverable"
	case errors.As(err, &kafka):
		return "kafka"
	default:
		return "postgres"
	}
}

// kafkaError marks an error of the Kafka side.
type kafkaError struct{ err error }

// Error implements error.
func (e *kafkaError) Error() string { return e.err.Error() }

// Unwrap returns the underlying error.
func (e *kafkaError) Unwrap() error { return e.err }

// Snapshot returns the pipeline's current figures.
func (p *Pipeline) Snapshot() Snapshot {
	s := Snapshot{
		State:              p.State(),
		Rows:               p.Replication.Rows.Load(),
		Transactions:       p.Replication.Transactions.Load(),
		IgnoredUpdates:     p.Replication.IgnoredUpdates.Load(),
		IgnoredDeletes:     p.Replication.IgnoredDeletes.Load(),
		IgnoredTruncates:   p.Replication.IgnoredTruncates.Load(),
		IgnoredOtherTables: p.Replication.IgnoredOtherTables.Load(),
		Produced:           p.Router.Produced.Load(),
		ProducedBytes:      p.Router.ProducedBytes.Load(),
		DeadLettered:       p.Router.DeadLettered.Load(),
		InFlightRecords:    p.Router.InFlightRecords.Load(),
		InFlightBytes:      p.Router.InFlightBytes.Load(),
		ConfirmedLSN:       p.Replication.ConfirmedLSN.Load(),
		ServerWALEnd:       p.Replication.ServerWALEnd.Load(),
	}
	p.obs.mu.Lock()
	tr := p.obs.tracker
	s.Restarts = p.obs.restarts
	s.Errors = make(map[string]int64, len(p.obs.errors))
	for k, v := range p.obs.errors {
		s.Errors[k] = v
	}
	s.Slot = p.obs.slot
	s.LastVerified = p.obs.verified
	p.obs.mu.Unlock()
	if tr != nil && s.State == StateStreaming {
		if st := tr.Stats(); !st.OldestCommitTime.IsZero() {
			s.SecondsBehind = max(time.Since(st.OldestCommitTime).Seconds(), 0)
		}
	}
	return s
}

// slotPollInterval is how often the slot's health is read from pg_replication_slots.
const slotPollInterval = 10 * time.Second

// pollSlot reads the slot's status until ctx ends, on its own connection, also while on standby.
func (p *Pipeline) pollSlot(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for {
		if conn == nil {
			cfg, err := pgx.ParseConfig(p.cfg.Postgres.URL)
			if err == nil {
				cfg.RuntimeParams["application_name"] = "outbox-cdc-monitor"
				conn, err = pgx.ConnectConfig(ctx, cfg)
			}
			if err != nil {
				conn = nil
				p.log.Debug("slot monitor: connect", "error", err.Error())
			}
		}
		if conn != nil {
			st, err := querySlot(ctx, conn, p.cfg.Postgres.Slot)
			if err != nil {
				p.log.Debug("slot monitor: query", "error", err.Error())
				_ = conn.Close(context.Background())
				conn = nil
			} else {
				p.obs.mu.Lock()
				p.obs.slot = st
				p.obs.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(slotPollInterval):
		}
	}
}

func querySlot(ctx context.Context, conn *pgx.Conn, slot string) (SlotStatus, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st := SlotStatus{Known: true}
	err := conn.QueryRow(qctx, `SELECT active, coalesce(wal_status, ''),
		coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0)
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&st.Active, &st.WALStatus, &st.LagBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotStatus{Known: true}, nil
	}
	if err != nil {
		return SlotStatus{}, err
	}
	st.Exists = true
	return st, nil
}
