// Package inbox is the consuming half of the outbox pattern: an idempotent handler for Kafka records
// that outbox-cdc (or any producer that sets an event id) delivers at least once.
//
// For every record it begins a database transaction, claims the event (INSERT ... ON CONFLICT DO
// NOTHING on the consumer's name and the event id), checks the aggregate's version, runs the
// service's handler in that same transaction, commits, and only then commits the Kafka offset. A
// redelivered event finds its claim and is skipped; an event whose aggregate_version is not above the
// last one applied for its aggregate on its topic is stale and skipped (or dead-lettered); a failing
// handler is retried with exponential backoff and jitter and, after MaxAttempts, handed to the
// dead-letter topic with the reason. Claims older than Retention are pruned in small batches.
//
// The tables are in sql/inbox.sql (Setup creates them). Records are read in a consumer group with
// franz-go, one transaction per record, partitions of one poll in parallel and each partition in
// order. It does not import outbox-cdc's router or replication code.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox"
	outboxsql "github.com/outbox-cdc/outbox-cdc/sql"
)

// DB is the database the claims, the versions and the handler's changes share: a *pgxpool.Pool, or
// anything else safe for concurrent use that begins transactions (partitions are handled in parallel).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Event is one record as the handler sees it.
type Event struct {
	// ID is the event id: header event_id, or ce_id in the CloudEvents format.
	ID string
	// Type is header event_type (or ce_type).
	Type string
	// AggregateType is header aggregate_type (or ce_aggregatetype); "" when absent.
	AggregateType string
	// AggregateID is the record key (or ce_subject when the key is empty).
	AggregateID string
	// AggregateVersion is header aggregate_version (or ce_aggregateversion); HasVersion is false when
	// the record carries none, and then no version check is made.
	AggregateVersion int64
	HasVersion       bool
	// Payload is the record value.
	Payload []byte
	// Record is the Kafka record itself (headers, topic, partition, offset).
	Record *kgo.Record
}

// Handler applies one event inside the inbox's transaction: its changes commit together with the
// claim, or not at all. An error makes the inbox roll back and retry; wrap it with Permanent when
// retrying cannot help.
type Handler func(ctx context.Context, tx pgx.Tx, ev Event) error

// permanentError marks a handler error that retrying cannot fix.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as one that retrying cannot fix: the event goes to the dead-letter topic at once.
func Permanent(err error) error { return &permanentError{err} }

// StalePolicy says what happens to an event whose aggregate version is not above the last one applied.
type StalePolicy int

const (
	// SkipStale records the event as stale and skips it (the default).
	SkipStale StalePolicy = iota
	// DeadLetterStale hands it to the dead-letter topic with the reason, and records it so.
	DeadLetterStale
)

// Options configure an Inbox. Consumer, DB, Handler, Brokers, Topics and Group are required.
type Options struct {
	// Consumer names the consuming service in the claims: every instance of one service shares it,
	// and two services reading the same events have different names.
	Consumer string
	// DB holds the inbox tables and the handler's tables.
	DB DB
	// Handler applies an event.
	Handler Handler
	// Brokers, Topics and Group say what to consume, in which consumer group.
	Brokers []string
	Topics  []string
	Group   string
	// KafkaOpts are added to the consumer's franz-go options (TLS, SASL, ...); the inbox sets the
	// group, topics, manual commits and rebalance blocking itself.
	KafkaOpts []kgo.Opt
	// Table is the claims table, schema-qualified or not (default public.inbox); the versions table is
	// its name with _versions appended, in the same schema.
	Table string
	// Stale is what happens to stale events (default SkipStale).
	Stale StalePolicy
	// MaxAttempts is how often a failing handler runs before the event is dead-lettered (default 5).
	MaxAttempts int
	// RetryBackoff is the first wait between attempts, doubled each time up to MaxRetryBackoff, each
	// wait with ±50% jitter (defaults 100 ms and 5 s). A poll's retries hold the group's rebalance:
	// keep MaxAttempts × MaxRetryBackoff well under the rebalance timeout (60 s by default).
	RetryBackoff, MaxRetryBackoff time.Duration
	// DeadLetterTopic takes events that failed MaxAttempts times, failed permanently, or are stale
	// under DeadLetterStale, with headers saying why. Empty: Run returns the error instead (the
	// service stops rather than skip an event).
	DeadLetterTopic string
	// MaxPollRecords bounds the records handled per poll (default 500).
	MaxPollRecords int
	// BatchSize is how many consecutive events of one partition share a transaction (default 50; 1:
	// one transaction per event). A batch whose handler or statement fails is rolled back and its
	// events handled one by one, so a handler may see an event again; only its effects in the
	// transaction count.
	BatchSize int
	// Retention is how long claims are kept; Run prunes older ones every PruneInterval (default one
	// hour) in batches of PruneBatch rows (default 1000). 0 keeps them forever.
	Retention     time.Duration
	PruneInterval time.Duration
	PruneBatch    int
	// Registerer, when set, registers the inbox's metrics.
	Registerer prometheus.Registerer
	// Logger receives one line per dead-lettered event, failure and prune (default: discarded).
	Logger *slog.Logger
}

// Outcomes of an event, as recorded in the claims table and counted in the metrics.
const (
	OutcomeApplied      = "applied"
	OutcomeDuplicate    = "duplicate" // counted only: a duplicate has the first copy's claim
	OutcomeStale        = "stale"
	OutcomeDeadLettered = "dead_lettered"
)

// Headers the inbox adds to a dead-letter record, besides the original record's.
const (
	HeaderDLQReason    = "inbox.dlq.reason"
	HeaderDLQConsumer  = "inbox.dlq.consumer"
	HeaderDLQAttempts  = "inbox.dlq.attempts"
	HeaderDLQTopic     = "inbox.dlq.topic"
	HeaderDLQPartition = "inbox.dlq.partition"
	HeaderDLQOffset    = "inbox.dlq.offset"
	HeaderDLQTime      = "inbox.dlq.time"
)

// Stats counts what an Inbox did since it was created.
type Stats struct {
	Applied, Duplicates, Stale, DeadLettered, Failures, Pruned int64
}

// Inbox consumes records and applies each event once.
type Inbox struct {
	o                       Options
	client                  *kgo.Client
	claims, versions, index string // sanitized identifiers
	claimSQL                string // the claim statement (claimStatement), built once
	m                       *metrics
	applied, duplicates     atomic.Int64
	stale, deadLettered     atomic.Int64
	failures, pruned        atomic.Int64
	// unreachableFor is how long the database may fail an event's statements before Run stops.
	unreachableFor time.Duration
}

// New checks the options, creates the consumer and registers the metrics. Close releases it.
func New(o Options) (*Inbox, error) {
	switch {
	case o.Consumer == "":
		return nil, errors.New("inbox: Consumer is required (the consuming service's name)")
	case o.DB == nil:
		return nil, errors.New("inbox: DB is required")
	case o.Handler == nil:
		return nil, errors.New("inbox: Handler is required")
	case len(o.Brokers) == 0 || len(o.Topics) == 0 || o.Group == "":
		return nil, errors.New("inbox: Brokers, Topics and Group are required")
	}
	if o.Table == "" {
		o.Table = "public.inbox"
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 5
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 100 * time.Millisecond
	}
	if o.MaxRetryBackoff < o.RetryBackoff {
		o.MaxRetryBackoff = max(5*time.Second, o.RetryBackoff)
	}
	if o.MaxPollRecords <= 0 {
		o.MaxPollRecords = 500
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 50
	}
	if o.PruneInterval <= 0 {
		o.PruneInterval = time.Hour
	}
	if o.PruneBatch <= 0 {
		o.PruneBatch = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Stale == DeadLetterStale && o.DeadLetterTopic == "" {
		return nil, errors.New("inbox: Stale is DeadLetterStale but DeadLetterTopic is empty")
	}
	schema, name, ok := strings.Cut(o.Table, ".")
	if !ok {
		schema, name = "public", o.Table
	}
	if schema == "" || name == "" || strings.Contains(name, ".") {
		return nil, fmt.Errorf("inbox: Table %q is not [schema.]table", o.Table)
	}
	in := &Inbox{
		o:              o,
		unreachableFor: 30 * time.Second,
		claims:         pgx.Identifier{schema, name}.Sanitize(),
		versions:       pgx.Identifier{schema, name + "_versions"}.Sanitize(),
		index:          pgx.Identifier{name + "_handled_at"}.Sanitize(),
	}
	in.claimSQL = claimStatement(in.claims, in.versions)
	m, err := newMetrics(o.Consumer, o.Registerer)
	if err != nil {
		return nil, err
	}
	in.m = m
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// A new group starts at the beginning: the outbox's events are all to be handled.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Exactly-once producers' aborted transactions are never handled.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}, o.KafkaOpts...)
	if in.client, err = kgo.NewClient(opts...); err != nil {
		in.m.unregister()
		return nil, fmt.Errorf("inbox: create the Kafka consumer: %w", err)
	}
	return in, nil
}

// Close leaves the consumer group and unregisters the metrics.
func (in *Inbox) Close() {
	in.client.Close()
	in.m.unregister()
}

// Setup creates the inbox tables (sql/inbox.sql, under the configured names) if they do not exist,
// and the dead-letter topic if there is one and it is missing (with the brokers' default partitions
// and replication): an event that fails must find it, not stall on it and stop Run.
func (in *Inbox) Setup(ctx context.Context) error {
	ddl := strings.NewReplacer("public.inbox_versions", in.versions, "public.inbox", in.claims, "inbox_handled_at", in.index).Replace(outboxsql.Inbox)
	if _, err := in.o.DB.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("inbox: create the tables: %w", err)
	}
	if in.o.DeadLetterTopic == "" {
		return nil
	}
	_, err := kadm.NewClient(in.client).CreateTopic(ctx, -1, -1, nil, in.o.DeadLetterTopic)
	switch {
	case err == nil:
		in.o.Logger.Info("inbox: created the dead-letter topic", "topic", in.o.DeadLetterTopic)
	case errors.Is(err, kerr.TopicAlreadyExists):
	default:
		return fmt.Errorf("inbox: the dead-letter topic %s is missing and could not be created (create it, or give the principal CREATE on it): %w", in.o.DeadLetterTopic, err)
	}
	return nil
}

// Stats returns the counts so far.
func (in *Inbox) Stats() Stats {
	return Stats{Applied: in.applied.Load(), Duplicates: in.duplicates.Load(), Stale: in.stale.Load(),
		DeadLettered: in.deadLettered.Load(), Failures: in.failures.Load(), Pruned: in.pruned.Load()}
}

// Run consumes until ctx ends (returning nil) or an event can be neither applied nor dead-lettered
// (returning why; the records from that one on are not committed, and a restart handles them again).
func (in *Inbox) Run(ctx context.Context) error {
	if in.o.Retention > 0 {
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		go in.pruneLoop(pctx)
	}
	for {
		fetches := in.client.PollRecords(ctx, in.o.MaxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			in.client.AllowRebalance()
			return nil
		}
		failed := false
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				failed = true
				in.o.Logger.Warn("inbox: fetch error; the client retries", "topic", topic, "partition", partition, "error", err.Error())
			}
		})
		err := in.handleFetches(ctx, fetches)
		in.client.AllowRebalance()
		if failed && fetches.NumRecords() == 0 {
			// An error without records (a missing topic, say) is not polled for again at once.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// handleFetches handles one poll: each partition in order, partitions in parallel; then it commits
// the offsets of what was handled, also when a partition failed.
func (in *Inbox) handleFetches(ctx context.Context, fetches kgo.Fetches) error {
	var mu sync.Mutex
	var done []*kgo.Record
	var errs []error
	var wg sync.WaitGroup
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last *kgo.Record
			for i := 0; i < len(p.Records); i += in.o.BatchSize {
				batch := p.Records[i:min(i+in.o.BatchSize, len(p.Records))]
				if err := in.handleBatch(ctx, batch); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					break
				}
				last = batch[len(batch)-1]
			}
			if last != nil {
				mu.Lock()
				done = append(done, last)
				mu.Unlock()
			}
		}()
	})
	wg.Wait()
	if len(done) > 0 {
		// A commit that fails is not fatal: the claims make the redelivery harmless.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if err := in.client.CommitRecords(cctx, done...); err != nil {
			in.o.Logger.Warn("inbox: offset commit failed; the events are handled and their redelivery will be skipped", "error", err.Error())
		}
		cancel()
	}
	return errors.Join(errs...)
}

// handle applies one record, retrying as configured; it returns an error only when the event could
// be neither applied nor dead-lettered.
func (in *Inbox) handle(ctx context.Context, r *kgo.Record) error {
	return in.handleAfter(ctx, r, nil)
}

// handleAfter is handle for a record whose handler already failed once (first, from a batch): that
// counts as its first attempt, so that a permanent failure is not run again, nor counted twice.
func (in *Inbox) handleAfter(ctx context.Context, r *kgo.Record, first *handlerFailure) error {
	ev := eventOf(r)
	if ev.ID == "" {
		return in.deadLetter(ctx, ev, "the record has no event id (header event_id or ce_id): it cannot be claimed", 0)
	}
	backoff := in.o.RetryBackoff
	attempts, unreachable := 0, time.Time{}
	for {
		start := time.Now()
		var outcome string
		var err error
		if first != nil {
			err, first = first, nil
		} else {
			outcome, err = in.attempt(ctx, ev)
		}
		if err == nil {
			if outcome == OutcomeStale && in.o.Stale == DeadLetterStale {
				return in.deadLetter(ctx, ev, fmt.Sprintf("stale: aggregate_version %d is not above the last applied on topic %s", ev.AggregateVersion, r.Topic), attempts)
			}
			in.count(outcome, time.Since(start))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var hf *handlerFailure
		if !errors.As(err, &hf) {
			// The database, not the event: wait for it, without counting attempts, as long as a
			// rebalance can be held (counted from when it stopped answering, not from the first time
			// ever); then stop and let a restart try again.
			if unreachable.IsZero() {
				unreachable = time.Now()
			}
			if time.Since(unreachable) > in.unreachableFor {
				return fmt.Errorf("inbox: event %s (%s/%d@%d): %w", ev.ID, r.Topic, r.Partition, r.Offset, err)
			}
			in.o.Logger.Warn("inbox: database error; retrying", "event_id", ev.ID, "error", err.Error())
		} else {
			unreachable = time.Time{} // the database answered
			attempts++
			in.failures.Add(1)
			in.m.failures.Inc()
			var perm *permanentError
			if errors.As(hf.err, &perm) || attempts >= in.o.MaxAttempts {
				reason := fmt.Sprintf("handler failed %d times: %v", attempts, hf.err)
				if perm != nil {
					reason = fmt.Sprintf("handler failed permanently: %v", hf.err)
				}
				return in.deadLetter(ctx, ev, reason, attempts)
			}
			in.o.Logger.Debug("inbox: handler failed; retrying", "event_id", ev.ID, "attempt", attempts, "error", hf.err.Error())
		}
		wait := time.Duration(float64(backoff) * (0.5 + rand.Float64()))
		backoff = min(2*backoff, in.o.MaxRetryBackoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// handlerFailure is an error of the user's handler, as opposed to one of the inbox's own statements.
type handlerFailure struct{ err error }

func (h *handlerFailure) Error() string { return "handler: " + h.err.Error() }
func (h *handlerFailure) Unwrap() error { return h.err }

// attempt runs one transaction for ev: claim, version check, handler, commit. It returns the outcome,
// or a *handlerFailure when the handler failed while the database answered, or another error.
func (in *Inbox) attempt(ctx context.Context, ev Event) (string, error) {
	tx, err := in.o.DB.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	outcome, err := in.apply(ctx, tx, ev)
	if err != nil || outcome == OutcomeDuplicate {
		return outcome, err // a duplicate changed nothing: rolled back
	}
	if outcome == OutcomeStale && in.o.Stale == DeadLetterStale {
		// Rolled back: the claim is recorded only once the dead letter is written (deadLetter), so
		// that a failed write leaves the event to be handled again.
		return outcome, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return outcome, nil
}

// deadLetter writes ev's record to the dead-letter topic with the reason, then records the event as
// dead-lettered so that a redelivery does not send it again. Without a dead-letter topic it returns
// the reason as an error: the event is never skipped silently.
func (in *Inbox) deadLetter(ctx context.Context, ev Event, reason string, attempts int) error {
	r := ev.Record
	if in.o.DeadLetterTopic == "" {
		return fmt.Errorf("inbox: event %s (%s/%d@%d) cannot be handled and no dead-letter topic is configured: %s", ev.ID, r.Topic, r.Partition, r.Offset, reason)
	}
	dlq := &kgo.Record{Topic: in.o.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
		kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQConsumer, Value: []byte(in.o.Consumer)},
		kgo.RecordHeader{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kgo.RecordHeader{Key: HeaderDLQTime, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)}
	if err := in.client.ProduceSync(ctx, dlq).FirstErr(); err != nil {
		return fmt.Errorf("inbox: write event %s to the dead-letter topic %s: %w", ev.ID, in.o.DeadLetterTopic, err)
	}
	in.o.Logger.Warn("inbox: dead-lettered an event", "event_id", ev.ID, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"reason", reason, "dlq_topic", in.o.DeadLetterTopic)
	if ev.ID != "" {
		if _, err := in.o.DB.Exec(ctx, "INSERT INTO "+in.claims+` (consumer, event_id, outcome, topic, partition, "offset") VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (consumer, event_id) DO UPDATE SET outcome = EXCLUDED.outcome`, in.o.Consumer, ev.ID, OutcomeDeadLettered, r.Topic, r.Partition, r.Offset); err != nil {
			// The dead letter is written; a redelivery may write it again.
			in.o.Logger.Warn("inbox: could not record the dead-lettered event", "event_id", ev.ID, "error", err.Error())
		}
	}
	in.count(OutcomeDeadLettered, 0)
	return nil
}

// count records an outcome in the stats and metrics.
func (in *Inbox) count(outcome string, took time.Duration) {
	switch outcome {
	case OutcomeApplied:
		in.applied.Add(1)
		in.m.handleSeconds.Observe(took.Seconds())
	case OutcomeDuplicate:
		in.duplicates.Add(1)
	case OutcomeStale:
		in.stale.Add(1)
	case OutcomeDeadLettered:
		in.deadLettered.Add(1)
	}
	in.m.events.WithLabelValues(outcome).Inc()
}

// eventOf reads the event's attributes from a record in either header format.
func eventOf(r *kgo.Record) Event {
	ev := Event{Payload: r.Value, Record: r, AggregateID: string(r.Key)}
	get := func(names ...string) (string, bool) {
		for _, n := range names {
			for _, h := range r.Headers {
				if h.Key == n {
					return string(h.Value), true
				}
			}
		}
		return "", false
	}
	ev.ID, _ = get(outbox.HeaderEventID, "ce_id")
	ev.Type, _ = get(outbox.HeaderEventType, "ce_type")
	ev.AggregateType, _ = get(outbox.HeaderAggregateType, "ce_aggregatetype")
	if ev.AggregateID == "" {
		ev.AggregateID, _ = get("ce_subject")
	}
	if v, ok := get(outbox.HeaderAggregateVersion, "ce_aggregateversion"); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			ev.AggregateVersion, ev.HasVersion = n, true
		}
	}
	return ev
}
