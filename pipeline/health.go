package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Health is a consistent-enough view of the pipeline for metrics and health checks.
type Health struct {
	// State is what the pipeline is doing.
	State State
	// Ready is true only when the pipeline streams, has heard from the server within
	// postgres.receive_timeout, and the slot monitor saw the slot held by this instance's walsender
	// recently; NotReady says why not.
	Ready    bool
	NotReady string
	// StandbyReady is true on a hot standby that is ready to take over: it waits for the slot (held by
	// another instance) and its slot monitor reads the slot's state freshly, so PostgreSQL answers it.
	// Orchestrators that run two replicas count it as ready (/readyz?standby=ready).
	StandbyReady bool
	// Replication counters.
	Rows, Transactions, IgnoredUpdates, IgnoredDeletes, IgnoredTruncates, IgnoredOtherTables int64
	// Messages are the outbox messages decoded (postgres.message_prefixes); IgnoredMessages those of
	// other prefixes.
	Messages, IgnoredMessages int64
	// Router counters.
	Produced, ProducedBytes, DeadLettered, InFlightRecords, InFlightBytes int64
	// InFlightWindow is the in-flight window's records cap now (limits.min/max_inflight_records).
	InFlightWindow int64
	// ConfirmedLSN is the last position confirmed to the server; ServerWALEnd the server's last WAL end.
	ConfirmedLSN, ServerWALEnd uint64
	// LastServerMessage is when the current session last heard from the server; zero without one.
	LastServerMessage time.Time
	// SecondsBehind is now minus the commit time of the oldest unacknowledged transaction; 0 when idle.
	SecondsBehind float64
	// Restarts counts sessions rebuilt after a failure.
	Restarts int64
	// Errors counts failures by class: postgres, kafka, undeliverable.
	Errors map[string]int64
	// Slot is the slot monitor's latest reading of pg_replication_slots (every slotPollInterval),
	// valid only when SlotKnown: the reading succeeded, at SlotObservedAt, within slotStale.
	Slot           replication.SlotState
	SlotKnown      bool
	SlotObservedAt time.Time
	// SlotMonitorErrors counts failed polls; SlotMonitorLastSuccess is when one last succeeded.
	SlotMonitorErrors      int64
	SlotMonitorLastSuccess time.Time
	// LastVerified is when the outbox was last verified to be published (zero before the first
	// session); confirms never pass the position of that check.
	LastVerified time.Time
	// CheckpointLSN is the last checkpoint committed to Kafka, or read from it at start (exactly-once
	// mode; zero otherwise or before the first); the slot is never confirmed past it.
	CheckpointLSN uint64
	// TransactionsCommitted and TransactionsAborted count Kafka transactions (exactly-once mode).
	TransactionsCommitted, TransactionsAborted int64
	// SkippedRows counts rows skipped at start as already in Kafka (exactly-once mode).
	SkippedRows int64
	// PhantomRisk is true while the slot is a failover slot and the primary's
	// synchronized_standby_slots is empty: a failover to a standby that was behind would leave events in
	// Kafka whose transactions the new primary never had. PhantomRiskKnown is false before the first
	// session checked it.
	PhantomRisk, PhantomRiskKnown bool
	// Warnings are risks the operator should know of that do not make the pipeline unready.
	Warnings []string
	// Paused is true while an operator has paused the source (the fleet API): its pipeline is stopped,
	// its slot released, on purpose; readiness does not count it. PausedSince is when it was paused.
	// The slot is still watched meanwhile (Watch): its lag and WAL status stay known.
	Paused      bool
	PausedSince time.Time
	// Server is the PostgreSQL server the current session streams from (host:port as connected:
	// with a multi-host postgres.url, the one that answered); empty between sessions.
	Server string
	// LastError is the last failure that ended a session or stopped the pipeline (as it was logged:
	// scrub it before showing it), at LastErrorAt; empty before the first.
	LastError   string
	LastErrorAt time.Time
}

// observed is the pipeline's mutable state read by Health.
type observed struct {
	mu          sync.Mutex
	tracker     *checkpoint.Tracker
	backendPID  int    // the walsender of the current session, 0 without one
	server      string // the server the current session streams from, "" without one
	restarts    int64
	errors      map[string]int64
	lastError   string
	lastErrorAt time.Time
	slot        replication.SlotState // valid when slotAt is not zero
	slotAt      time.Time
	slotErrors  int64
	slotSuccess time.Time
	verified    time.Time
	checkpoint  checkpoint.LSN
	phantomRisk *bool // nil before the first check
}

// setPhantomRisk records the latest phantom-risk check and returns the one before.
func (o *observed) setPhantomRisk(risk bool) (was bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	was = o.phantomRisk != nil && *o.phantomRisk
	o.phantomRisk = &risk
	return was
}

// hadCheckpoint reports whether this process read or committed a checkpoint.
func (o *observed) hadCheckpoint() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.checkpoint != 0
}

func (o *observed) markCheckpoint(lsn checkpoint.LSN) {
	o.mu.Lock()
	o.checkpoint = max(o.checkpoint, lsn)
	o.mu.Unlock()
}

// setSession records the current session's tracker and walsender (nil and 0 when it ends).
func (o *observed) setSession(tr *checkpoint.Tracker, backendPID int, server string) {
	o.mu.Lock()
	o.tracker, o.backendPID, o.server = tr, backendPID, server
	o.mu.Unlock()
}

func (o *observed) markVerified(at time.Time) {
	o.mu.Lock()
	o.verified = at
	o.mu.Unlock()
}

func (o *observed) countError(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.errors == nil {
		o.errors = map[string]int64{}
	}
	o.errors[errorClass(err)]++
	o.restarts++
	o.lastError, o.lastErrorAt = err.Error(), time.Now()
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

// Health returns the pipeline's current figures and readiness.
func (p *Pipeline) Health() Health {
	s := Health{
		State:                 p.State(),
		Rows:                  p.Replication.Rows.Load(),
		Transactions:          p.Replication.Transactions.Load(),
		IgnoredUpdates:        p.Replication.IgnoredUpdates.Load(),
		IgnoredDeletes:        p.Replication.IgnoredDeletes.Load(),
		IgnoredTruncates:      p.Replication.IgnoredTruncates.Load(),
		IgnoredOtherTables:    p.Replication.IgnoredOtherTables.Load(),
		Messages:              p.Replication.Messages.Load(),
		IgnoredMessages:       p.Replication.IgnoredMessages.Load(),
		Produced:              p.Router.Produced.Load(),
		ProducedBytes:         p.Router.ProducedBytes.Load(),
		DeadLettered:          p.Router.DeadLettered.Load(),
		InFlightRecords:       p.Router.InFlightRecords.Load(),
		InFlightBytes:         p.Router.InFlightBytes.Load(),
		InFlightWindow:        p.Router.InFlightWindow.Load(),
		ConfirmedLSN:          p.Replication.ConfirmedLSN.Load(),
		ServerWALEnd:          p.Replication.ServerWALEnd.Load(),
		TransactionsCommitted: p.Router.TransactionsCommitted.Load(),
		TransactionsAborted:   p.Router.TransactionsAborted.Load(),
		SkippedRows:           p.skippedRows.Load(),
	}
	if ns := p.Replication.LastMessage.Load(); ns != 0 {
		s.LastServerMessage = time.Unix(0, ns)
	}
	p.obs.mu.Lock()
	tr, pid := p.obs.tracker, p.obs.backendPID
	s.Server = p.obs.server
	s.Restarts = p.obs.restarts
	s.Errors = make(map[string]int64, len(p.obs.errors))
	for k, v := range p.obs.errors {
		s.Errors[k] = v
	}
	s.Slot, s.SlotObservedAt = p.obs.slot, p.obs.slotAt
	s.SlotKnown = !s.SlotObservedAt.IsZero() && time.Since(s.SlotObservedAt) <= slotStale
	s.SlotMonitorErrors, s.SlotMonitorLastSuccess = p.obs.slotErrors, p.obs.slotSuccess
	s.LastVerified = p.obs.verified
	s.LastError, s.LastErrorAt = p.obs.lastError, p.obs.lastErrorAt
	s.CheckpointLSN = uint64(p.obs.checkpoint)
	if r := p.obs.phantomRisk; r != nil {
		s.PhantomRisk, s.PhantomRiskKnown = *r, true
	}
	p.obs.mu.Unlock()
	if s.PhantomRisk {
		s.Warnings = append(s.Warnings, phantomRiskWarning)
	}
	if !s.SlotKnown {
		s.Slot = replication.SlotState{Name: p.cfg.Postgres.Slot} // nothing known, never an old reading
	}
	if tr != nil && s.State == StateStreaming {
		if st := tr.Stats(); !st.OldestCommitTime.IsZero() {
			s.SecondsBehind = max(time.Since(st.OldestCommitTime).Seconds(), 0)
		}
	}
	s.Ready, s.NotReady = p.readiness(s, pid)
	s.StandbyReady = s.State == StateStandby && s.SlotKnown
	return s
}

// readiness says whether the pipeline is ready: streaming, hearing from the server, and holding the
// slot as the monitor last saw it. Each signal is a fresh observation; an old one counts as unknown.
func (p *Pipeline) readiness(s Health, backendPID int) (bool, string) {
	switch {
	case s.State == StateStandby:
		return false, "standby: another instance holds the slot; this one takes over when it frees"
	case s.State != StateStreaming:
		return false, s.State.String() + ": not streaming (connecting, waiting for Kafka, or retrying after a failure)"
	case s.LastServerMessage.IsZero() || time.Since(s.LastServerMessage) > p.cfg.Postgres.ReceiveTimeout:
		return false, fmt.Sprintf("silent: nothing received from PostgreSQL for over %s (postgres.receive_timeout)", p.cfg.Postgres.ReceiveTimeout)
	case !s.SlotKnown:
		return false, "unknown: the slot monitor has no recent observation of the slot"
	case !s.Slot.Active || s.Slot.ActivePID != backendPID:
		return false, fmt.Sprintf("not holding the slot: pg_replication_slots shows it active=%t for pid %d, this instance's walsender is pid %d", s.Slot.Active, s.Slot.ActivePID, backendPID)
	}
	return true, "streaming"
}

// slotPollInterval is how often the slot's health is read from pg_replication_slots; slotTimeout
// bounds one poll (connecting included); an observation older than slotStale is unknown.
const (
	slotPollInterval = 5 * time.Second
	slotTimeout      = 4 * time.Second
	slotStale        = 3 * slotPollInterval
)

// Watch reads the slot's state every few seconds until ctx ends, without streaming: the monitor of a
// source that does not stream here (paused), so that its lag, WAL status and a loss stay known —
// the WAL it pins grows while nothing reads the slot. Health reports what it read.
func (p *Pipeline) Watch(ctx context.Context) {
	p.state.Store(int32(StateStopped))
	p.pollSlot(ctx, nil)
}

// pollSlot reads the slot's status until ctx ends, on its own connection, also while on standby: every
// slotPollInterval, and at once when poke receives. A failed poll makes the status unknown and is
// counted; it never leaves the last good figures standing.
func (p *Pipeline) pollSlot(ctx context.Context, poke <-chan struct{}) {
	var mon *replication.Catalog
	defer func() {
		if mon != nil {
			_ = mon.Close(context.Background())
		}
	}()
	for {
		pctx, cancel := context.WithTimeout(ctx, slotTimeout)
		var err error
		reused := mon != nil
		if mon == nil {
			mon, err = replication.OpenMonitor(pctx, replication.TargetOf(p.cfg.Postgres))
		}
		var st replication.SlotState
		if err == nil {
			st, err = mon.Slot(pctx, p.cfg.Postgres.Slot)
		}
		if err != nil && reused && pctx.Err() == nil {
			// The connection may have ended since the last poll (the server restarted, a proxy or a
			// script ended an idle connection): a new one answers now rather than a poll later.
			_ = mon.Close(context.Background())
			if mon, err = replication.OpenMonitor(pctx, replication.TargetOf(p.cfg.Postgres)); err == nil {
				st, err = mon.Slot(pctx, p.cfg.Postgres.Slot)
			}
		}
		cancel()
		now := time.Now()
		p.obs.mu.Lock()
		if err != nil {
			p.obs.slot, p.obs.slotAt = replication.SlotState{}, time.Time{}
			p.obs.slotErrors++
		} else {
			p.obs.slot, p.obs.slotAt = st, now
			p.obs.slotSuccess = now
		}
		p.obs.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Debug("slot monitor: poll failed; the slot's state is unknown", "error", err.Error())
			if mon != nil {
				_ = mon.Close(context.Background())
				mon = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-poke:
		case <-time.After(slotPollInterval):
		}
	}
}
