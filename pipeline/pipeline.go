// Package pipeline wires replication, router and checkpoint into the run loop shared by the CLI
// commands: it streams committed outbox rows to Kafka, confirms only acknowledged positions, waits as
// a hot standby while another instance holds the slot, and rebuilds everything and replays from the
// slot after a failure.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/outbox"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Pipeline is the run loop. Create it with New and call Run once.
type Pipeline struct {
	cfg   config.Config
	log   *slog.Logger
	rules *router.Rules
	// tableRules route the rows of the further outbox tables (the tables list), in its order.
	tableRules []*router.Rules

	// Replication counts what the stream decoded and ignored.
	Replication replication.Counters
	// Router counts what the router delivered.
	Router router.Counters

	state    atomic.Int32
	obs      observed
	observer router.Observer
	// isolateUntil is the highest commit position of a batch Kafka rejected: transactions up to it
	// are produced one record at a time, so that only the record at fault is dead-lettered.
	isolateUntil uint64
	// gaps decides which gaps between the slot and the last checkpoint the exactly-once mode accepts.
	gaps gapPolicy
	// slotID identifies the slot across processes (exactly-once mode); learned once.
	slotID *checkpoint.SlotID
	// skippedRows counts rows skipped as already in Kafka (exactly-once mode).
	skippedRows atomic.Int64
	// tracer, if not nil, records the records' spans.
	tracer trace.Tracer
	// budget, if not nil, is the process's in-flight budget, shared with the other sources.
	budget *router.Budget
	// creations bounds the topics the pipeline's routers create per hour (kafka.max_new_topics_per_hour).
	creations *router.CreationLimit
	// streamedFrom is the slot's position when this process's first at-least-once session began:
	// the process delivered every transaction from there on (handOver).
	streamedFrom checkpoint.LSN
	// stopBefore is a row that can never be delivered (no dead-letter topic) that stopped an
	// exactly-once session: the next one commits the transactions before it, then stops there.
	stopBefore *router.UndeliverableError
	// rowsPerPart, when not zero, replaces rowsPerPart (tests read small tables in parts).
	rowsPerPart int64
}

// Option configures a Pipeline.
type Option func(*Pipeline)

// WithObserver has the router report every acknowledged record to o (for metrics).
func WithObserver(o router.Observer) Option {
	return func(p *Pipeline) { p.observer = o }
}

// WithTracer has the router record a producer span per record with t (tracing.otlp_endpoint).
func WithTracer(t trace.Tracer) Option {
	return func(p *Pipeline) { p.tracer = t }
}

// WithBudget has the pipeline's routers share the process's in-flight budget b with the other
// sources (fleet.max_inflight_bytes), beside its own limits.
func WithBudget(b *router.Budget) Option {
	return func(p *Pipeline) { p.budget = b }
}

// WithAcceptGap lets the exactly-once mode start from a slot that stands ahead of the last checkpoint
// in Kafka (the --accept-gap flag): what lies between may never have reached Kafka.
func WithAcceptGap() Option {
	return func(p *Pipeline) { p.gaps.flag = true }
}

// State is what the pipeline is doing.
type State int32

// The pipeline's states.
const (
	// StateStarting: connecting, setting up, or backing off after a failure.
	StateStarting State = iota
	// StateStandby: another instance holds the slot; this one waits to take over.
	StateStandby
	// StateStreaming: the slot is ours and WAL flows to Kafka.
	StateStreaming
	// StateStopped: Run has returned.
	StateStopped
)

// String names the state.
func (s State) String() string {
	return [...]string{"starting", "standby", "streaming", "stopped"}[s]
}

// State returns what the pipeline is doing now.
func (p *Pipeline) State() State { return State(p.state.Load()) }

// New validates what the configuration cannot check alone (the routing rules) and returns a pipeline.
func New(cfg config.Config, log *slog.Logger, opts ...Option) (*Pipeline, error) {
	rules, err := router.NewRules(cfg.Routing, cfg.Postgres.Columns)
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	// Shared by the exactly-once routers of every slot, in either mode of this one: a row's record
	// there could pass for a checkpoint.
	rules.Reserve(cfg.Kafka.CheckpointTopic, "kafka.checkpoint_topic, which holds the exactly-once checkpoints")
	if cfg.Kafka.ExactlyOnce() && !outbox.ValidTopic(cfg.Kafka.CheckpointTopic) {
		return nil, fmt.Errorf("invalid configuration: kafka.checkpoint_topic: %q is not a valid Kafka topic name", cfg.Kafka.CheckpointTopic)
	}
	p := &Pipeline{cfg: cfg, log: log, rules: rules, creations: router.NewCreationLimit(cfg.Kafka.MaxNewTopicsPerHour)}
	tables, err := cfg.OutboxTables()
	if err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	for i, t := range tables[1:] {
		tr, err := router.NewRules(t.Routing, cfg.Postgres.Columns)
		if err != nil {
			return nil, fmt.Errorf("invalid configuration: tables[%d]: %w", i, err)
		}
		tr.Reserve(cfg.Kafka.CheckpointTopic, "kafka.checkpoint_topic, which holds the exactly-once checkpoints")
		p.tableRules = append(p.tableRules, tr)
	}
	for _, o := range opts {
		o(p)
	}
	if p.gaps.flag && !cfg.Kafka.ExactlyOnce() {
		return nil, fmt.Errorf("invalid configuration: --accept-gap applies to kafka.delivery exactly-once only (at-least-once keeps no checkpoint that the slot could be ahead of)")
	}
	return p, nil
}

// columnRoles are the columns the router reads, checked at set-up against the table and on every
// Relation message of the stream: the four without which no record can be built, and the topic
// template's columns, are required; the header columns are optional.
func columnRoles(cfg config.Config, rules ...*router.Rules) []replication.ColumnRole {
	c := cfg.Postgres.Columns
	roles := []replication.ColumnRole{
		{Column: c.EventID, Key: "postgres.columns.event_id", Required: true},
		{Column: c.EventType, Key: "postgres.columns.event_type", Required: true},
		{Column: c.AggregateID, Key: "postgres.columns.aggregate_id", Required: true},
		{Column: c.Payload, Key: "postgres.columns.payload", Required: true},
	}
	for _, o := range []replication.ColumnRole{
		{Column: c.AggregateType, Key: "postgres.columns.aggregate_type"},
		{Column: c.AggregateVersion, Key: "postgres.columns.aggregate_version"},
		{Column: c.Headers, Key: "postgres.columns.headers"},
		{Column: c.CreatedAt, Key: "postgres.columns.created_at"},
		{Column: c.TraceContext, Key: "postgres.columns.trace_context"},
	} {
		if o.Column != "" {
			roles = append(roles, o)
		}
	}
	if cfg.Kafka.HeaderFormat == config.HeaderFormatDebezium {
		// Debezium needs no event type (its default table has one; the router uses it for the
		// metrics' labels only).
		roles[1].Required = false
		// Debezium stops on an additional field the table lacks; so does the router, at start.
		fields, _ := cfg.Kafka.Debezium.AdditionalFields()
		for _, f := range fields {
			if i := slices.IndexFunc(roles, func(r replication.ColumnRole) bool { return r.Column == f.Column }); i >= 0 {
				roles[i].Required = true
			} else {
				roles = append(roles, replication.ColumnRole{Column: f.Column, Key: "kafka.debezium.additional_placement", Required: true})
			}
		}
	}
	if c.Timestamp != "" {
		// Asked for by name: a table without it is refused at start, not silently stamped otherwise.
		i := slices.IndexFunc(roles, func(r replication.ColumnRole) bool { return r.Column == c.Timestamp })
		if i < 0 {
			roles = append(roles, replication.ColumnRole{Column: c.Timestamp, Key: "postgres.columns.timestamp", Required: true})
		} else {
			roles[i].Required = true
		}
	}
	for _, r := range rules {
		for _, col := range r.TemplateColumns() {
			i := slices.IndexFunc(roles, func(r replication.ColumnRole) bool { return r.Column == col })
			if i < 0 {
				roles = append(roles, replication.ColumnRole{Column: col, Key: "routing.topic", Required: true})
			} else {
				roles[i].Required = true
			}
		}
	}
	return roles
}

// columnRoles are the columns the router reads from the rows of every outbox table.
func (p *Pipeline) columnRoles() []replication.ColumnRole {
	return columnRoles(p.cfg, append([]*router.Rules{p.rules}, p.tableRules...)...)
}

// outbox names the configured outbox table and publication.
func (p *Pipeline) outbox() replication.Outbox {
	schema, table := replication.SplitTable(p.cfg.Postgres.Table)
	return replication.Outbox{Schema: schema, Table: table, Publication: p.cfg.Postgres.Publication}
}

// tables names the further outbox tables (the tables list), which share the publication.
func (p *Pipeline) tables() []replication.Outbox {
	var out []replication.Outbox
	for _, t := range p.cfg.Tables {
		schema, table := replication.SplitTable(t.Name)
		out = append(out, replication.Outbox{Schema: schema, Table: table, Publication: p.cfg.Postgres.Publication})
	}
	return out
}

// allTables names every outbox table: the configured one, then the tables list.
func (p *Pipeline) allTables() []replication.Outbox {
	return append([]replication.Outbox{p.outbox()}, p.tables()...)
}

// rulesOf returns the routing rules of outbox table i (Row.Table).
func (p *Pipeline) rulesOf(i int) *router.Rules {
	if i > 0 && i <= len(p.tableRules) {
		return p.tableRules[i-1]
	}
	return p.rules
}

// format is kafka.header_format for the router.
func (p *Pipeline) format() router.Format {
	f := router.Format{CloudEvents: p.cfg.Kafka.HeaderFormat == config.HeaderFormatCloudEvents, Source: p.cfg.EventSource()}
	if p.cfg.Kafka.HeaderFormat == config.HeaderFormatDebezium {
		d := p.cfg.Kafka.Debezium
		fields, _ := d.AdditionalFields() // validated with the configuration
		f.Debezium = &router.DebeziumFormat{JSON: d.Converter == config.DebeziumConverterJSON, Fields: fields,
			ExpandJSONPayload: d.ExpandJSONPayload, TombstoneOnEmptyPayload: d.TombstoneOnEmptyPayload}
	}
	return f
}

// permanent reports errors that replaying cannot fix: the operator must act.
func permanent(err error) bool {
	var undeliverable *router.UndeliverableError
	return replication.Refused(err) || errors.As(err, &undeliverable) || errors.Is(err, replication.ErrNotSetUp) || errors.Is(err, replication.ErrSlotLost) ||
		errors.Is(err, replication.ErrResyncInterrupted) || errors.Is(err, replication.ErrOutboxChanged) || errors.Is(err, replication.ErrUnreadable) || errors.Is(err, router.ErrConfig) ||
		errors.Is(err, checkpoint.ErrGap) || errors.Is(err, checkpoint.ErrMissing) || errors.Is(err, checkpoint.ErrBeyondWAL) || errors.Is(err, errTransactionTooLarge)
}

// maxBackoff caps every wait between sessions, jitter included.
const maxBackoff = 30 * time.Second

// Run streams until ctx ends (then it stops gracefully and returns nil) or a permanent error occurs.
// Transient failures — lost connections, a broker gone, a final produce error — are logged and
// retried from the slot with exponential backoff and jitter.
func (p *Pipeline) Run(ctx context.Context) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 500 * time.Millisecond
	bo.MaxInterval = maxBackoff
	bo.RandomizationFactor = 0.5
	c := carried{poke: make(chan struct{}, 1)}
	defer p.state.Store(int32(StateStopped))
	defer func() {
		if c.lingering != nil {
			c.lingering.rt.Close()
		}
	}()
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	go p.pollSlot(monitorCtx, c.poke)
	for {
		c.streamed, c.progressed = time.Time{}, false
		err := p.runOnce(ctx, &c)
		p.state.Store(int32(StateStarting))
		if ctx.Err() != nil {
			return nil
		}
		var poison *router.UndeliverableError
		if cfg := p.cfg; cfg.Kafka.ExactlyOnce() && errors.As(err, &poison) && poison.CommitLSN != 0 &&
			(p.stopBefore == nil || p.stopBefore.CommitLSN != poison.CommitLSN) {
			// The complete PostgreSQL transactions that shared the row's Kafka transaction were
			// aborted with it: one more session commits them, stopping where the row's begins.
			p.stopBefore = poison
			p.obs.countError(err)
			p.log.Warn("a row can never be delivered (no dead-letter topic): committing the complete transactions before it, then stopping",
				"event_id", poison.EventID, "commit_lsn", checkpoint.LSN(poison.CommitLSN).String())
			continue
		}
		if permanent(err) {
			p.obs.countError(err)
			return err
		}
		var wait time.Duration
		if errors.Is(err, replication.ErrSlotInUse) {
			if !c.standby {
				p.log.Info("slot is in use by another instance: waiting as hot standby", "slot", p.cfg.Postgres.Slot, "reason", err.Error())
				c.standby = true
			}
			p.state.Store(int32(StateStandby))
			wait = p.cfg.Postgres.StandbyPollInterval
		} else {
			if c.madeProgress() {
				bo.Reset() // the last session worked for a while: this is a new failure, not the same one again
			}
			wait = min(bo.NextBackOff(), maxBackoff)
			p.obs.countError(err)
			if c.streamed.IsZero() {
				p.log.Warn("cannot start a session (transient failure); retrying after backoff", "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
			} else {
				p.log.Warn("pipeline stopped (transient failure); replaying from the slot after backoff", "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// runOnce is one session: check Kafka, set up, stream until failure or ctx's end.
func (p *Pipeline) runOnce(ctx context.Context, c *carried) error {
	cfg := p.cfg
	if err := p.identify(ctx); err != nil {
		return err
	}
	if err := p.settleLingering(ctx, c); err != nil {
		return err
	}
	// Kafka first: a session that cannot deliver would only hold the slot and replay.
	rt, err := p.newRouter(ctx, func(o *router.Options) { o.DeferNewTopics = true })
	if err != nil {
		return err
	}
	kept := false // the router lingers past the session (settleLingering)
	defer func() {
		if !kept {
			rt.Close()
		}
	}()

	s, err := p.setup(ctx, c)
	if err != nil {
		return err
	}
	res, srv, conn := s.res, s.server, s.conn
	started := false
	defer func() {
		if !started {
			_ = conn.Close(context.Background())
		}
	}()
	if err := p.checkPhantomRisk(ctx, s.cat, res.Slot.Failover || res.WantFailover); err != nil {
		s.close()
		return err
	}
	v := &verifier{target: replication.TargetOf(cfg.Postgres), cat: s.cat, outbox: p.outbox(), more: p.tables(), log: p.log, obs: &p.obs, last: res.Verified,
		giveUp: cfg.Postgres.ReceiveTimeout}
	defer func() { c.verified = v.last }()
	p.obs.markVerified(time.Now())
	defer v.close()

	d, err := p.newDelivery(ctx, c, rt, res.Slot.ConfirmedFlush, srv, v.confirmLimit)
	if err != nil {
		return err // the catalog connection is the verifier's, closed with it
	}

	if res.WantFailover && !res.Slot.Failover {
		if err := replication.AlterSlotFailover(ctx, conn, cfg.Postgres.Slot); err != nil {
			p.log.Warn("could not make the slot a failover slot; it will not survive a promotion of a standby (postgres.failover_slot)", "slot", cfg.Postgres.Slot, "error", err.Error())
		} else {
			p.log.Info("made the slot a failover slot: standbys with sync_replication_slots keep a copy", "slot", cfg.Postgres.Slot)
		}
	}
	stream, err := replication.Start(ctx, conn, replication.Options{
		Slot: cfg.Postgres.Slot, Outbox: p.outbox(), Tables: p.tables(), Columns: p.columnRoles(), StartLSN: res.Slot.ConfirmedFlush,
		StatusInterval: cfg.Postgres.StatusInterval, ReceiveTimeout: cfg.Postgres.ReceiveTimeout, ConfirmLimit: d.confirmLimit,
		BaseType: p.baseType, Missing: res.Missing, Ignore: replication.IgnoredTables(cfg.Postgres.IgnoreTables), Logger: p.log, Counters: &p.Replication,
		MessagePrefixes: cfg.Postgres.MessagePrefixes,
	})
	if err != nil {
		return err
	}
	started = true
	defer func() { _ = stream.Close(context.Background()) }()
	c.lastPID = stream.BackendPID()

	if c.standby {
		p.log.Info("took over the slot from the previous instance", "slot", cfg.Postgres.Slot)
		c.standby = false
	}
	tracker := checkpoint.NewTracker(res.Slot.ConfirmedFlush)
	server := stream.Server()
	p.obs.setSession(tracker, c.lastPID, server)
	defer p.obs.setSession(nil, 0, "")
	p.log.Info("streaming", "slot", cfg.Postgres.Slot, "publication", cfg.Postgres.Publication,
		"table", cfg.Postgres.Table, "from_lsn", res.Slot.ConfirmedFlush.String(), "server", server)
	if c.server != "" && c.server != server {
		p.log.Warn("streaming from another server than the last session: a failover or switchover", "previous", c.server, "server", server)
	}
	c.server = server

	p.state.Store(int32(StateStreaming))
	c.streamed = time.Now()
	c.slotSeen = true
	select {
	case c.poke <- struct{}{}: // a fresh look at the slot, now held by this session
	default:
	}
	defer func() { c.progressed = checkpoint.LSN(p.Replication.ConfirmedLSN.Load()) > res.Slot.ConfirmedFlush }()
	streamCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-rt.Failed():
			cancel(rt.Err())
		case <-streamCtx.Done():
		}
	}()
	verifying := make(chan struct{})
	go func() {
		defer close(verifying)
		v.run(streamCtx, cancel)
	}()
	go p.watchKafka(streamCtx, tracker, cancel)
	h := d.handler(handler{router: rt, tracker: tracker})
	runErr := stream.Run(streamCtx, tracker, h)
	// Not streaming any more, whatever the clean-up below takes (an abort waits for Kafka).
	p.state.Store(int32(StateStarting))
	if ctx.Err() == nil && errors.Is(runErr, context.Canceled) {
		if cause := context.Cause(streamCtx); cause != nil {
			runErr = cause
		}
	}
	if rerr := rt.Err(); rerr != nil {
		runErr = d.kafkaFailed(rerr)
		var rejected *router.RejectedBatchError
		if errors.As(rerr, &rejected) {
			// Every record of the rejected partition fails with it; wait for their promises to name
			// their transactions, then replay those one record at a time.
			fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = rt.Flush(fctx)
			fcancel()
			p.isolateUntil = max(p.isolateUntil, rt.RejectedUpTo())
			p.log.Warn("kafka rejected a batch: replaying its transactions one record at a time", "topic", rejected.Topic,
				"error", rejected.Err.Error(), "isolate_until_lsn", checkpoint.LSN(p.isolateUntil).String())
		}
	}
	cancel(nil)
	<-verifying

	stop := d.end(ctx.Err() != nil && rt.Err() == nil, runErr)
	graceful := stop.graceful
	kept = stop.keepRouter
	if stop.abort != nil {
		defer stop.abort() // after the stream is closed (below), before the deferred rt.Close
		defer func() { _ = stream.Close(context.Background()) }()
	}
	if graceful {
		// Two more verifications, a moment apart, so that the final confirm covers what was just
		// acknowledged: a check confirms only what the check before it saw (verifier.accept).
		vctx, vcancel := context.WithTimeout(context.Background(), 2*verifyTimeout)
		err := v.once(vctx)
		if err == nil {
			time.Sleep(finalVerifyGap)
			err = v.once(vctx)
		}
		if err != nil {
			p.log.Warn("shutdown: could not verify the outbox once more; confirming up to the last verification", "error", err.Error())
		}
		vcancel()
	}
	// One last status update: everything acknowledged so far, and nothing more. On a graceful stop the
	// stream is ended properly, so that the update is applied before the connection closes.
	if graceful {
		fctx, fcancel := context.WithTimeout(context.Background(), finishTimeout)
		if err := stream.Finish(fctx); err == nil {
			p.log.Debug("replication stream ended cleanly")
		} else {
			p.log.Warn("shutdown: the replication stream did not end cleanly; the final confirm may be lost (the next start re-sends it)", "error", err.Error())
		}
		fcancel()
	} else if cerr := stream.Confirm(); cerr != nil && runErr == nil {
		runErr = cerr
	}
	if graceful {
		d.stopped(srv)
		st := tracker.Stats()
		p.log.Info("stopped", "confirmed_lsn", checkpoint.LSN(p.Replication.ConfirmedLSN.Load()).String(), "unacknowledged_records", st.PendingRecords)
		return nil
	}
	return runErr
}

// setup opens the catalog connection and checks (and creates) what the stream needs. A slot still
// held by this process's previous session is taken back.
func (p *Pipeline) setup(ctx context.Context, c *carried) (*session, error) {
	cfg := p.cfg
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return nil, err
	}
	// A hot standby polls here while another instance streams: it learns that from the catalog,
	// without taking a WAL sender for a replication connection on every poll.
	if c.standby {
		if slot, err := cat.Slot(ctx, cfg.Postgres.Slot); err == nil && slot.Active && slot.ActivePID != c.lastPID {
			_ = cat.Close(context.Background())
			return nil, fmt.Errorf("%w: slot %q is active for pid %d", replication.ErrSlotInUse, cfg.Postgres.Slot, slot.ActivePID)
		}
	}
	conn, srv, err := p.connect(ctx, cat)
	if err != nil {
		_ = cat.Close(context.Background())
		return nil, err
	}
	s := &session{cat: cat, conn: conn, server: srv}
	if err := p.identifyAgain(srv); err != nil {
		s.close()
		return nil, err
	}
	opts := replication.SetupOptions{
		Outbox: p.outbox(), Tables: p.tables(), Slot: cfg.Postgres.Slot, Columns: p.columnRoles(),
		CreatePublication: cfg.Postgres.CreatePublication, CreateSlot: cfg.Postgres.CreateSlot, FailoverSlot: cfg.Postgres.FailoverSlot,
		SlotSeen: c.slotSeen, PublicationSeen: c.slotSeen, Server: srv, ApplicationName: conn.ParameterStatus("application_name"),
		Ignore: replication.IgnoredTables(cfg.Postgres.IgnoreTables),
	}
	res, err := cat.Setup(ctx, opts)
	if errors.Is(err, replication.ErrSlotInUse) && c.lastPID != 0 && res.Slot.ActivePID == c.lastPID {
		ended, terr := cat.TerminateSlotHolder(ctx, cfg.Postgres.Slot, c.lastPID)
		if terr != nil {
			err = errors.Join(err, terr)
		} else if ended {
			p.log.Warn("ended this process's previous replication session, which still held the slot (its connection died without the server noticing)",
				"slot", cfg.Postgres.Slot, "pid", c.lastPID)
			for i := 0; i < 50 && errors.Is(err, replication.ErrSlotInUse); i++ {
				time.Sleep(100 * time.Millisecond)
				res, err = cat.Setup(ctx, opts)
			}
		}
	}
	if err == nil {
		// What happened to the outbox between the last session and this one.
		err = res.Verified.Continues(c.verified, p.outbox(), p.tables()...)
	}
	s.res = res
	for _, w := range res.Changed {
		p.log.Warn(w)
	}
	if err != nil {
		s.close()
		return s, err
	}
	if res.CreatedPublication {
		p.log.Info("created publication", "publication", cfg.Postgres.Publication, "table", cfg.Postgres.Table)
	}
	if res.CreatedSlot {
		p.log.Info("created replication slot", "slot", cfg.Postgres.Slot)
	}
	for _, w := range res.Warnings {
		p.log.Warn(w)
	}
	return s, nil
}

// phantomRiskWarning says what a failover slot without synchronized_standby_slots risks.
const phantomRiskWarning = "the slot is a failover slot, but the primary's synchronized_standby_slots is empty: the router may receive (and publish) transactions that no standby has yet, " +
	"and after a failover to a standby that was behind, Kafka holds events whose transactions the new primary never had (phantom events). " +
	"Set synchronized_standby_slots to the standbys' physical slots (see outbox-cdc status --standby)"

// checkPhantomRisk reads, for a failover slot, whether the primary holds logical walsenders back
// until its standbys have flushed (synchronized_standby_slots): without it a failover can leave
// phantom events in Kafka. It warns when that state changes, and health and metrics report it.
func (p *Pipeline) checkPhantomRisk(ctx context.Context, cat *replication.Catalog, failoverSlot bool) error {
	risk := false
	if failoverSlot {
		pf, err := cat.PrimaryFailover(ctx)
		if err != nil {
			return err
		}
		risk = pf.FailoverSupported() && len(pf.SynchronizedStandbySlots) == 0
	}
	if was := p.obs.setPhantomRisk(risk); risk && !was {
		p.log.Warn(phantomRiskWarning, "slot", p.cfg.Postgres.Slot)
	} else if !risk && was {
		p.log.Info("synchronized_standby_slots is set now: a failover can no longer leave phantom events", "slot", p.cfg.Postgres.Slot)
	}
	return nil
}

// session is what set-up opened for one session: the catalog connection (the verifier's), the
// replication connection that will stream, the server it reached, and what set-up found.
type session struct {
	cat    *replication.Catalog
	conn   *pgconn.PgConn
	server replication.Server
	res    replication.SetupResult
}

// close closes both connections (the stream, once started, owns conn and closes it itself).
func (s *session) close() {
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
	}
	_ = s.cat.Close(context.Background())
}

// connect opens the replication connection that will stream and asks who its server is. A
// connection refused for a reason set-up names (a role without REPLICATION, wal_level below logical)
// is explained over the catalog connection cat.
func (p *Pipeline) connect(ctx context.Context, cat *replication.Catalog) (*pgconn.PgConn, replication.Server, error) {
	conn, err := replication.Connect(ctx, replication.TargetOf(p.cfg.Postgres))
	if err != nil {
		return nil, replication.Server{}, cat.ExplainConnectFailure(ctx, err)
	}
	srv, err := replication.IdentifyServer(ctx, conn)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, replication.Server{}, err
	}
	return conn, srv, nil
}

// finishTimeout bounds the clean end of the replication stream at a graceful stop.
const finishTimeout = 5 * time.Second

// inFlightWait bounds the wait for Kafka's acknowledgements of what is in flight when a session ends
// on a PostgreSQL failure (at-least-once): what is acknowledged by then is not sent again. Usually
// they are there within milliseconds; the bound keeps a slow broker from delaying the reconnection.
const inFlightWait = time.Second

// errTransactionTooLarge stops the router: a PostgreSQL transaction cannot be delivered within the
// Kafka transaction timeout, and a replay would only time out again.
var errTransactionTooLarge = errors.New("a PostgreSQL transaction does not fit in one Kafka transaction")

// errReleased ends a session that lets go of the replication connection so that PostgreSQL is not
// held: the slot keeps everything unconfirmed, and the next session replays it.
var errReleased = errors.New("released the replication connection")

// baseType is the stream's BaseType: it asks the catalog over a connection of its own (the stream
// asks once per user-defined type of an outbox column the router reads, so rarely).
func (p *Pipeline) baseType(ctx context.Context, oid uint32) (uint32, error) {
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(p.cfg.Postgres))
	if err != nil {
		return 0, err
	}
	defer func() { _ = cat.Close(context.Background()) }()
	return cat.BaseType(ctx, oid)
}

// identifyAgain checks that the server the session streams from is of the cluster the exactly-once
// mode's slot identity names; if it is another (restored into a new cluster), the identity is
// learned anew and the session starts over, so that its Kafka transactions and checkpoints carry it.
func (p *Pipeline) identifyAgain(srv replication.Server) error {
	if p.slotID == nil || (p.slotID.SystemID == srv.SystemID && p.slotID.Database == srv.Database) {
		return nil
	}
	old := *p.slotID
	p.slotID = &checkpoint.SlotID{SystemID: srv.SystemID, Database: srv.Database, Slot: p.cfg.Postgres.Slot}
	return fmt.Errorf("the database system changed under the router (slot identity %s, now %s): starting over with the new identity", old, p.slotID)
}

// identify learns, once, what identifies the slot across processes (exactly-once mode only): the
// cluster's system identifier and the database, with the slot's name.
func (p *Pipeline) identify(ctx context.Context) error {
	if !p.cfg.Kafka.ExactlyOnce() || p.slotID != nil {
		return nil
	}
	sys, db, err := replication.Identify(ctx, replication.TargetOf(p.cfg.Postgres))
	if err != nil {
		return err
	}
	p.slotID = &checkpoint.SlotID{SystemID: sys, Database: db, Slot: p.cfg.Postgres.Slot}
	return nil
}

var _ replication.Batcher = (*quietHandler)(nil)

// handler hands rows from the stream to the router and records them in the tracker.
type handler struct {
	router  *router.Router
	tracker *checkpoint.Tracker
	// skip (at-least-once), when not nil, skips the transactions an earlier session of this process
	// saw acknowledged by Kafka.
	skip *skipper
	// ackTx and ack are the last transaction delivered and its acknowledgement callback, shared by
	// its rows: one closure per transaction, not per row.
	ackTx *checkpoint.Tx
	ack   func()
}

// Deliver implements replication.Handler.
func (h *handler) Deliver(ctx context.Context, tx *checkpoint.Tx, row *replication.Row) error {
	if h.skip.skips(tx) {
		return nil
	}
	prepared, err := h.router.Prepare(ctx, row, router.Source{LSN: uint64(row.LSN), CommitTime: tx.CommitTime(), CommitLSN: uint64(tx.CommitLSN())})
	if err != nil {
		return err
	}
	h.tracker.Add(tx)
	if h.ackTx != tx {
		tracker := h.tracker
		h.ackTx, h.ack = tx, func() { tracker.Ack(tx) }
	}
	h.router.Produce(prepared, h.ack)
	h.skip.handed()
	return nil
}
