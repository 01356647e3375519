package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
)

// Options configure a Router.
type Options struct {
	// Kafka is the kafka section of the configuration: brokers, client id, security, topic creation,
	// the largest record, linger.
	Kafka config.Kafka
	// Rules choose each row's topic.
	Rules *Rules
	// TableRules choose the topics of the rows of further outbox tables: a row whose OutboxTable is
	// i+1 (replication.Row's Table) is routed by TableRules[i]; every other row by Rules.
	TableRules []*Rules
	// Columns name the outbox columns.
	Columns config.Columns
	// Format says which headers carry the event's attributes.
	Format Format
	// DLQTopic receives undeliverable rows; empty means such a row stops the router.
	DLQTopic string
	// Limits cap what is handed to Kafka and not yet acknowledged.
	Limits config.Limits
	// Budget, if not nil, caps the bytes in flight of every router that shares it (a fleet's
	// sources) beside Limits.
	Budget *Budget
	// IsolateUntil, when not zero, has every row whose Source.CommitLSN is at or below it produced
	// alone: one record in flight, in a batch of its own. A previous session's batch that Kafka
	// rejected is replayed this way, so that only the record at fault is dead-lettered.
	IsolateUntil uint64
	// TopicSetupTimeout bounds the creation and inspection of one topic (default 30 s).
	TopicSetupTimeout time.Duration
	// TopicCreations, if not nil, bounds the topics the router creates per hour
	// (kafka.max_new_topics_per_hour): rows for a new topic past it are dead-lettered with the reason.
	TopicCreations *CreationLimit
	// PartitionCheckInterval is how often the partition counts of the topics in use are read, to
	// warn of one that grew (default 30 s).
	PartitionCheckInterval time.Duration
	// DeferNewTopics lets Prepare return at once for a row whose topic the router has not used yet:
	// the topic is created or inspected in the background while the stream goes on, and the router
	// holds that topic's records, in order, until it is ready. Without it Prepare waits for the
	// topic (resync does, to count its rows per topic as it goes).
	DeferNewTopics bool
	// Logger receives the router's log lines.
	Logger *slog.Logger
	// Counters, if not nil, are updated as the router runs.
	Counters *Counters
	// Observer, if not nil, is told of every acknowledged record (for metrics).
	Observer Observer
	// Transactions, if not nil, turn on the exactly-once mode (see Transactions, Commit and Fence).
	Transactions *Transactions
	// ExtraOpts are appended to the franz-go options (tests use them to point at kfake).
	ExtraOpts []kgo.Opt
	// Tracer, if not nil, records a producer span per record, child of the row's trace context, and
	// hands the span's context on in the record's traceparent header.
	Tracer trace.Tracer
}

// Counters count the router's work. All fields are safe for concurrent reads.
type Counters struct {
	// Produced counts records acknowledged by Kafka on their topic.
	Produced atomic.Int64
	// ProducedBytes counts key and value bytes of those records.
	ProducedBytes atomic.Int64
	// DeadLettered counts records acknowledged on the dead-letter topic.
	DeadLettered atomic.Int64
	// InFlightRecords and InFlightBytes are what is handed to Kafka and not yet acknowledged.
	InFlightRecords, InFlightBytes atomic.Int64
	// InFlightWindow is the records' cap now (the adaptive window, at most limits.max_inflight_records).
	InFlightWindow atomic.Int64
	// TransactionsCommitted and TransactionsAborted count Kafka transactions (exactly-once mode).
	TransactionsCommitted, TransactionsAborted atomic.Int64
}

// Observer is told of every acknowledged record. Its methods run on the producer's promise
// goroutine and must not block.
type Observer interface {
	// Produced reports a record acknowledged on its topic: its size (key and value), the time from
	// Produce to the acknowledgement, and the time from its transaction's commit to the acknowledgement.
	Produced(topic, eventType string, bytes int, produceLatency, endToEnd time.Duration)
	// DeadLettered reports a record acknowledged on the dead-letter topic, with the class of its
	// reason: unroutable, undecodable, too_large or rejected.
	DeadLettered(eventType, class string)
}

// Source describes where a row came from, for dead-letter headers, latency metrics and isolation.
type Source struct {
	// LSN is the WAL position of the row; for a row of resync's snapshot (Snapshot), the snapshot's
	// consistent point. It is formatted only when needed (Position): not for every row.
	LSN uint64
	// Snapshot says the row was read from the table's snapshot by resync, not from the WAL.
	Snapshot bool
	// CommitTime is the commit time of the row's transaction.
	CommitTime time.Time
	// CommitLSN is the commit position of the row's transaction (zero when the row does not come
	// from the WAL): a rejected batch is replayed alone up to the highest one (Options.IsolateUntil).
	CommitLSN uint64
}

// Position formats where the row came from as dead-letter headers, logs and spans show it: the row's
// WAL position as PostgreSQL writes it (16/B374D848), or snapshot@ and the snapshot's consistent point.
func (s Source) Position() string {
	if s.Snapshot {
		return "snapshot@" + checkpoint.LSN(s.LSN).String()
	}
	return checkpoint.LSN(s.LSN).String()
}

// ErrConfig is returned (wrapped) for a Kafka setting that can never work (a CA file without a
// certificate, an unknown SASL mechanism, a dead-letter topic that does not exist and may not be
// created): retrying does not help.
var ErrConfig = errors.New("kafka configuration")

// UndeliverableError is returned when a row can never be delivered and no dead-letter topic is set.
// Replaying cannot help: the operator must act.
type UndeliverableError struct {
	// EventID names the row; Reason says why it can never be delivered.
	EventID string
	Reason  string
	// CommitLSN is the commit position of the row's transaction (Source.CommitLSN; 0 when unknown).
	CommitLSN uint64
}

// Error implements error.
func (e *UndeliverableError) Error() string {
	return fmt.Sprintf("event %s can never be delivered and routing.dlq_topic is not set: %s", e.EventID, e.Reason)
}

// RejectedBatchError is the router's failure when Kafka rejected a batch as too large or invalid. The
// client fails every record buffered for the partition with the same error, so which record is at
// fault is known only by producing each alone: the pipeline replays the transactions up to UpTo with
// Options.IsolateUntil, and dead-letters only a record that fails on its own.
type RejectedBatchError struct {
	// Topic is the topic of the rejected batch; Err the broker's error.
	Topic string
	Err   error
	// UpTo is the highest commit position among the rejected records (see Router.RejectedUpTo for
	// the final figure once every promise has run).
	UpTo uint64
}

// Error implements error.
func (e *RejectedBatchError) Error() string {
	return fmt.Sprintf("kafka rejected a batch for topic %s (%v): replaying its transactions one record at a time to find the record at fault", e.Topic, e.Err)
}

// Unwrap returns the broker's error.
func (e *RejectedBatchError) Unwrap() error { return e.Err }

// Router delivers rows to Kafka. Prepare and Produce are called from one goroutine; acknowledgements run on the
// producer's promise goroutine.
type Router struct {
	opts    Options
	client  *kgo.Client
	alone   *kgo.Client // linger 0, for records produced alone; nil unless Options.IsolateUntil is set
	admin   *kadm.Client
	log     *slog.Logger
	limiter *limiter
	topics  *sync.Map // topic -> topicInfo, once prepared
	// createDenied says once that the principal may not create topics; limitReached that
	// kafka.max_new_topics_per_hour was reached.
	createDenied, limitReached sync.Once
	// prepMu guards preps, waiting and keyWaiting (Options.DeferNewTopics).
	prepMu sync.Mutex
	preps  map[string]*topicPrep // topics being prepared
	// waiting are the records that wait for their topic, or behind a waiting record of their key,
	// in the order they were produced; keyWaiting counts them per key, with those being released.
	waiting    []waitingRecord
	keyWaiting map[string]int
	// waitingCount counts the records in waiting or being released; releaseMu lets one release run at a time.
	waitingCount atomic.Int64
	releaseMu    sync.Mutex
	// lastAlone is true when the previous record was produced alone: the next one waits until it
	// is acknowledged, since two clients do not keep order between them. Prepare's goroutine only.
	lastAlone bool
	// lanes are the transactional producers (see Transactions.Lanes); lanes[0] is client, and
	// outside transactions it is the only one. lane is the index of the one records go to.
	lanes []*kgo.Client
	lane  atomic.Int32
	// inTxn is true, per lane, while a Kafka transaction is open on it; txnRecords counts the
	// records produced into the open transaction of the current lane. Prepare's goroutine, or the
	// commit goroutine that switches lanes while Prepare waits (txnMu and the switch's channel order
	// them).
	inTxn      [maxLanes]bool
	txnRecords int
	// txnBegan is when each lane's open Kafka transaction began (Unix nanoseconds), read on the
	// promise goroutine to tell a timed-out transaction from a takeover.
	txnBegan [maxLanes]atomic.Int64
	// txnMu guards committing, ending and queued, and orders Produce after a commit's switch of lanes.
	// committing is not nil while a commit waits for its records' acknowledgements (StartCommit), and
	// closed once records may go to the next transaction; queued holds, in order, the records produced
	// meanwhile, for the next transaction. ending is closed when the last commit begun has ended.
	txnMu      sync.Mutex
	committing chan struct{}
	ending     chan struct{}
	queued     []waitingRecord

	closeCtx context.Context // ends when the router closes
	closeFn  context.CancelFunc
	kicking  atomic.Bool // a Kick's flush is running

	rejectedUpTo atomic.Uint64

	// types interns the event types of prepared records (their metrics label): one string per event
	// type, not one per row. Bounded by maxResolved; typesMu guards it.
	typesMu sync.Mutex
	types   map[string]string

	failOnce sync.Once
	failed   chan struct{}
	failErr  error
}

// New creates a router and its Kafka client. It does not contact Kafka; Ping does.
func New(opts Options) (*Router, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Counters == nil {
		opts.Counters = new(Counters)
	}
	if opts.TopicSetupTimeout <= 0 {
		opts.TopicSetupTimeout = 30 * time.Second
	}
	if opts.Limits.MaxInFlightRecords <= 0 || opts.Limits.MaxInFlightBytes <= 0 || opts.Kafka.MaxMessageBytes <= 0 {
		return nil, errors.New("router: in-flight limits and max message bytes must be positive")
	}
	topics := new(sync.Map)
	kopts, err := ClientOpts(opts.Kafka)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	kopts = append(kopts,
		kgo.ClientID(opts.Kafka.ClientID),
		// Idempotent, acks=all and unlimited retries are franz-go's defaults and must stay so:
		// a record-level retry or timeout limit could reorder or drop records.
		// Batches never exceed what their topic takes, so that one record's size cannot make the broker
		// reject a batch of innocent ones.
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if v, ok := topics.Load(topic); ok && v.(topicInfo).limit > 0 {
				return v.(topicInfo).limit
			}
			return opts.Kafka.MaxMessageBytes
		}),
		// The limiter caps what is in flight; the client's own buffer must never be the one that blocks.
		kgo.MaxBufferedRecords(2*opts.Limits.MaxInFlightRecords+16),
		kgo.ProducerBatchCompression(Compression(opts.Kafka.Compression)),
		kgo.WithLogger(kgoLogger{opts.Logger}),
		kgo.MetadataMinAge(producerMetadataMinAge),
	)
	if t := opts.Transactions; t != nil {
		kopts = append(kopts, kgo.TransactionalID(t.Slot.TransactionalID()), kgo.TransactionTimeout(t.Timeout))
	}
	if d := opts.Format.Debezium; d != nil && slices.ContainsFunc(d.Fields, func(f config.AdditionalField) bool { return f.Placement == config.PlacementPartition }) {
		// franz-go's default partitioner (Kafka's murmur2 of the key for keyed records, like Java's),
		// except for records whose row names their partition.
		kopts = append(kopts, kgo.RecordPartitioner(placingPartitioner{kgo.UniformBytesPartitioner(64<<10, true, true, nil)}))
	}
	kopts = append(kopts, opts.ExtraOpts...)
	// Always set: franz-go's own default is 10 ms, so leaving it unset for 0 would linger anyway.
	client, err := kgo.NewClient(append(slices.Clip(kopts), kgo.ProducerLinger(opts.Kafka.Linger))...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	var alone *kgo.Client
	if opts.IsolateUntil > 0 && opts.Transactions == nil {
		// In transactions, records go alone through the one transactional client.
		if alone, err = kgo.NewClient(append(slices.Clip(kopts), kgo.ProducerLinger(0))...); err != nil {
			client.Close()
			return nil, fmt.Errorf("create kafka client: %w", err)
		}
	}
	lanes := []*kgo.Client{client}
	if t := opts.Transactions; t != nil && t.lanes() > 1 {
		second, err := kgo.NewClient(append(slices.Clip(kopts), kgo.ProducerLinger(opts.Kafka.Linger), kgo.TransactionalID(t.laneID(1)))...)
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("create kafka client: %w", err)
		}
		lanes = append(lanes, second)
	}
	closeCtx, closeFn := context.WithCancel(context.Background())
	r := &Router{
		opts:       opts,
		client:     client,
		lanes:      lanes,
		alone:      alone,
		admin:      kadm.NewClient(client),
		log:        opts.Logger,
		limiter:    newLimiter(opts.Limits.MinInFlightRecords, opts.Limits.MaxInFlightRecords, opts.Limits.MaxInFlightBytes, opts.Budget),
		topics:     topics,
		preps:      make(map[string]*topicPrep),
		keyWaiting: make(map[string]int),
		closeCtx:   closeCtx,
		closeFn:    closeFn,
		failed:     make(chan struct{}),
	}
	go r.watchPartitions(closeCtx)
	return r, nil
}

// Ping checks that a broker answers, and that the dead-letter topic, if configured, exists or can be
// created.
func (r *Router) Ping(ctx context.Context) error {
	if err := r.client.Ping(ctx); err != nil {
		return fmt.Errorf("reach kafka brokers %v: %w", r.opts.Kafka.Brokers, err)
	}
	if r.transactional() {
		if err := r.prepareCheckpointTopic(ctx); err != nil {
			return err
		}
	}
	if r.opts.DLQTopic != "" {
		info, err := r.prepareTopic(ctx, r.opts.DLQTopic)
		if err != nil {
			return err
		}
		if info.refused != "" {
			return fmt.Errorf("%w: routing.dlq_topic: %s", ErrConfig, info.refused)
		}
	}
	return nil
}

// Failed is closed when the router has hit an error it cannot get past; Err then returns it.
func (r *Router) Failed() <-chan struct{} { return r.failed }

// Err returns the router's failure, or nil.
func (r *Router) Err() error {
	select {
	case <-r.failed:
		return r.failErr
	default:
		return nil
	}
}

// RejectedUpTo is the highest commit position among records Kafka rejected in a batch (0 when none):
// the next session isolates up to it. Read it once the producer has settled (after Flush).
func (r *Router) RejectedUpTo() uint64 { return r.rejectedUpTo.Load() }

func (r *Router) fail(err error) {
	r.failOnce.Do(func() {
		r.failErr = err
		close(r.failed)
		if !r.transactional() {
			// Nothing produced after the failure may reach Kafka ahead of the failed records'
			// replay: franz-go failed what it had buffered for the failed partition, but records
			// produced since would go out normally. Fail everything still buffered, and whatever
			// is produced while that runs (Produce refuses from now on). In transactions the
			// aborted transaction hides it all from read_committed consumers anyway.
			go func() {
				ctx, cancel := context.WithTimeout(r.closeCtx, 30*time.Second)
				defer cancel()
				if err := r.client.AbortBufferedRecords(ctx); err != nil {
					r.log.Debug("abort buffered records after a failure", "error", err.Error())
				}
				if r.alone != nil {
					_ = r.alone.AbortBufferedRecords(ctx)
				}
			}()
		}
	})
}

// Kick sends the records lingering in the producer now, without waiting for kafka.linger, and returns
// at once; the stream calls it when the WAL has gone quiet after a transaction. For up to one linger,
// records produced meanwhile are sent at once too, batched behind the request in flight (franz-go
// keeps one produce request in flight per broker); after that, lingering resumes, so that a kick does
// not turn a busy stream into many small requests.
func (r *Router) Kick() {
	if r.opts.Kafka.Linger <= 0 || !r.kicking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.kicking.Store(false)
		ctx, cancel := context.WithTimeout(r.closeCtx, r.opts.Kafka.Linger)
		defer cancel()
		_ = r.client.Flush(ctx) // a failed record fails the router through its promise
	}()
}

// Flush waits until every buffered record is acknowledged (or failed) or ctx ends.
func (r *Router) Flush(ctx context.Context) error {
	if err := r.drainWaiting(ctx); err != nil {
		return err
	}
	if r.alone != nil {
		if err := r.alone.Flush(ctx); err != nil {
			return fmt.Errorf("flush kafka producer: %w", err)
		}
	}
	if err := r.client.Flush(ctx); err != nil {
		return fmt.Errorf("flush kafka producer: %w", err)
	}
	return nil
}

// Close closes the Kafka clients; records not yet acknowledged are failed and never acknowledged.
func (r *Router) Close() {
	r.closeFn()
	// A background commit ends with the client; wait for it, so that nothing uses a closed client.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = r.WaitCommit(ctx)
	cancel()
	for _, c := range r.lanes {
		c.Close()
	}
	if r.alone != nil {
		r.alone.Close()
	}
}
