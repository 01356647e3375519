package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Options configure a Router.
type Options struct {
	// Brokers are the seed brokers.
	Brokers []string
	// ClientID is the Kafka client id.
	ClientID string
	// Security configures TLS and SASL.
	Security Security
	// Rules choose each row's topic.
	Rules *Rules
	// Columns name the outbox columns.
	Columns Columns
	// DLQTopic receives undeliverable rows; empty means such a row stops the router.
	DLQTopic string
	// CreateTopics creates missing topics with TopicPartitions and TopicReplicationFactor.
	CreateTopics bool
	// TopicPartitions and TopicReplicationFactor shape created topics.
	TopicPartitions        int32
	TopicReplicationFactor int16
	// MaxMessageBytes is the largest record sent; larger rows are dead-lettered.
	MaxMessageBytes int32
	// MaxInFlightRecords and MaxInFlightBytes cap what is handed to Kafka and not yet acknowledged.
	MaxInFlightRecords int
	// MaxInFlightBytes caps the bytes of those records.
	MaxInFlightBytes int64
	// Linger is the producer's linger.
	Linger time.Duration
	// Logger receives the router's log lines.
	Logger *slog.Logger
	// Counters, if not nil, are updated as the router runs.
	Counters *Counters
	// Observer, if not nil, is told of every acknowledged record (for metrics).
	Observer Observer
	// ExtraOpts are appended to the franz-go options (tests use them to point at kfake).
	ExtraOpts []kgo.Opt
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
}

// Observer is told of every acknowledged record. Its methods run on the producer's promise
// goroutine and must not block.
type Observer interface {
	// Produced reports a record acknowledged on its topic: its size (key and value), the time from
	// Produce to the acknowledgement, and the time from its transaction's commit to the acknowledgement.
	Produced(topic, eventType string, bytes int, produceLatency, endToEnd time.Duration)
	// DeadLettered reports a record acknowledged on the dead-letter topic, with the class of its
	// reason: unroutable, too_large or rejected.
	DeadLettered(eventType, class string)
}

// Source describes where a row came from, for dead-letter headers and latency metrics.
type Source struct {
	// LSN is the WAL position of the row, formatted as PostgreSQL does.
	LSN string
	// CommitTime is the commit time of the row's transaction.
	CommitTime time.Time
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
}

// Error implements error.
func (e *UndeliverableError) Error() string {
	return fmt.Sprintf("event %s can never be delivered and routing.dlq_topic is not set: %s", e.EventID, e.Reason)
}

// Router delivers rows to Kafka. Prepare and Produce are called from one goroutine; acknowledgements run on the
// producer's promise goroutine.
type Router struct {
	opts    Options
	client  *kgo.Client
	admin   *kadm.Client
	log     *slog.Logger
	limiter *limiter
	limits  *sync.Map             // topic -> int32: the largest batch the topic takes (min of its max.message.bytes and ours)
	preps   map[string]*topicPrep // topics being prepared; used by Prepare's goroutine only

	closeCtx context.Context // ends when the router closes
	closeFn  context.CancelFunc

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
	if opts.MaxInFlightRecords <= 0 || opts.MaxInFlightBytes <= 0 || opts.MaxMessageBytes <= 0 {
		return nil, errors.New("router: in-flight limits and max message bytes must be positive")
	}
	limits := new(sync.Map)
	kopts, err := ClientOpts(opts.Brokers, opts.Security)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	kopts = append(kopts,
		kgo.ClientID(opts.ClientID),
		// Idempotent, acks=all and unlimited retries are franz-go's defaults and must stay so:
		// a record-level retry or timeout limit could reorder or drop records.
		// Batches never exceed what their topic takes, so that one record's size cannot make the broker
		// reject a batch of innocent ones.
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if v, ok := limits.Load(topic); ok {
				return v.(int32)
			}
			return opts.MaxMessageBytes
		}),
		// The limiter caps what is in flight; the client's own buffer must never be the one that blocks.
		kgo.MaxBufferedRecords(2*opts.MaxInFlightRecords+16),
		kgo.WithLogger(kgoLogger{opts.Logger}),
	)
	if opts.Linger > 0 {
		kopts = append(kopts, kgo.ProducerLinger(opts.Linger))
	}
	kopts = append(kopts, opts.ExtraOpts...)
	client, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	closeCtx, closeFn := context.WithCancel(context.Background())
	return &Router{
		opts:     opts,
		client:   client,
		admin:    kadm.NewClient(client),
		log:      opts.Logger,
		limiter:  newLimiter(opts.MaxInFlightRecords, opts.MaxInFlightBytes),
		limits:   limits,
		preps:    make(map[string]*topicPrep),
		closeCtx: closeCtx,
		closeFn:  closeFn,
		failed:   make(chan struct{}),
	}, nil
}

// Ping checks that a broker answers, and creates the dead-letter topic if it is configured and
// topic creation is on.
func (r *Router) Ping(ctx context.Context) error {
	if err := r.client.Ping(ctx); err != nil {
		return fmt.Errorf("reach kafka brokers %v: %w", r.opts.Brokers, err)
	}
	if r.opts.DLQTopic != "" {
		if _, err := r.prepareTopic(ctx, r.opts.DLQTopic); err != nil {
			return err
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

func (r *Router) fail(err error) {
	r.failOnce.Do(func() {
		r.failErr = err
		close(r.failed)
	})
}

// Prepared is a routed record that holds its room under the in-flight caps until it is acknowledged.
type Prepared struct {
	rec       *kgo.Record
	size      int64
	src       Source
	dlqReason string // non-empty: the record goes to the dead-letter topic for this reason
	dlqClass  string
}

// Prepare routes row and takes room for it under the in-flight caps, blocking while they are reached.
// If ctx ends first it returns ctx's error and holds nothing. It returns the router's failure once
// there is one, and an *UndeliverableError for a row that can never be delivered when no
// dead-letter topic is set.
func (r *Router) Prepare(ctx context.Context, row Row, src Source) (*Prepared, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	rec, size, problem, class := resolve(r.opts.Rules, r.opts.Columns, row, r.opts.MaxMessageBytes)
	if problem == nil {
		limit, err := r.prepareTopic(ctx, rec.Topic)
		if err != nil {
			return nil, err
		}
		if size > int(limit)-512 {
			problem = &Unroutable{Reason: fmt.Sprintf("record of %d bytes exceeds max.message.bytes of topic %s (%d)", size, rec.Topic, limit)}
			class = "too_large"
		}
	}
	p := &Prepared{rec: rec, src: src, size: int64(min(size, int(r.opts.MaxMessageBytes)))}
	if problem != nil {
		if r.opts.DLQTopic == "" {
			err := &UndeliverableError{EventID: header(rec, HeaderEventID), Reason: problem.Error()}
			r.fail(err)
			return nil, err
		}
		p.dlqReason, p.dlqClass = problem.Error(), class
	}
	if err := r.limiter.Acquire(ctx, p.size); err != nil {
		return nil, err
	}
	r.trackInFlight()
	return p, nil
}

// Topic is where the prepared record goes, or "" when it goes to the dead-letter topic.
func (p *Prepared) Topic() string {
	if p.dlqReason != "" {
		return ""
	}
	return p.rec.Topic
}

// Produce hands a prepared record to Kafka without blocking; ack runs once the record, or its
// dead-letter record, is acknowledged. A final produce error fails the router instead: ack never
// runs, so the slot never moves past the record.
func (r *Router) Produce(p *Prepared, ack func()) {
	if p.dlqReason != "" {
		r.produceDLQ(p.rec, p.src, p.dlqReason, p.dlqClass, p.size, ack)
		return
	}
	start := time.Now()
	r.client.Produce(context.Background(), p.rec, func(rec *kgo.Record, err error) {
		if err == nil {
			n := len(rec.Key) + len(rec.Value)
			r.opts.Counters.Produced.Add(1)
			r.opts.Counters.ProducedBytes.Add(int64(n))
			r.release(p.size)
			if r.opts.Observer != nil {
				now := time.Now()
				var e2e time.Duration
				if !p.src.CommitTime.IsZero() {
					e2e = now.Sub(p.src.CommitTime)
				}
				r.opts.Observer.Produced(rec.Topic, header(rec, HeaderEventType), n, now.Sub(start), e2e)
			}
			ack()
			return
		}
		if neverDeliverable(err) {
			r.produceDLQ(rec, p.src, fmt.Sprintf("kafka rejected the record: %v", err), "rejected", p.size, ack)
			return
		}
		r.release(p.size)
		r.fail(fmt.Errorf("produce event %s to %s: %w", header(rec, HeaderEventID), rec.Topic, err))
	})
}

// resolve builds the record for row with its topic and size, or says why the row can never be
// delivered (problem) and the class of that reason.
func resolve(rules *Rules, cols Columns, row Row, maxMessageBytes int32) (rec *kgo.Record, size int, problem error, class string) {
	rec, problem = buildRecord(row, cols)
	if problem == nil {
		rec.Topic, problem = rules.Topic(row)
	}
	size = recordSize(rec)
	class = "unroutable"
	if problem == nil && size > int(maxMessageBytes)-512 {
		problem = &Unroutable{Reason: fmt.Sprintf("record of %d bytes exceeds kafka.max_message_bytes (%d)", size, maxMessageBytes)}
		class = "too_large"
	}
	return rec, size, problem, class
}

// Plan says where row would go without sending it: its topic, or why it can never be delivered.
// Dry runs use it.
func Plan(rules *Rules, cols Columns, row Row, maxMessageBytes int32) (topic string, problem error) {
	rec, _, problem, _ := resolve(rules, cols, row, maxMessageBytes)
	return rec.Topic, problem
}

// neverDeliverable reports whether Kafka rejected the record itself, so that retrying can never help.
func neverDeliverable(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage)
}

// produceDLQ writes the dead-letter record for rec; the room held under size is released when it is
// acknowledged. It never blocks, so it may run on the promise goroutine.
func (r *Router) produceDLQ(orig *kgo.Record, src Source, reason, class string, size int64, ack func()) {
	if r.opts.DLQTopic == "" {
		r.release(size)
		r.fail(&UndeliverableError{EventID: header(orig, HeaderEventID), Reason: reason})
		return
	}
	dlq := &kgo.Record{Topic: r.opts.DLQTopic, Key: orig.Key, Value: orig.Value}
	dlq.Headers = append(dlq.Headers, orig.Headers...)
	dlq.Headers = append(dlq.Headers,
		kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQSourceLSN, Value: []byte(src.LSN)},
		kgo.RecordHeader{Key: HeaderDLQTime, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	)
	if orig.Topic != "" {
		dlq.Headers = append(dlq.Headers, kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(orig.Topic)})
	}
	// The dead-letter topic has a size limit too: keep as much of the value as fits and say so.
	dlqLimit := r.opts.MaxMessageBytes
	if v, ok := r.limits.Load(r.opts.DLQTopic); ok {
		dlqLimit = v.(int32)
	}
	if limit := int(dlqLimit) - 4096 - (recordSize(dlq) - len(dlq.Value)); len(dlq.Value) > limit {
		dlq.Headers = append(dlq.Headers,
			kgo.RecordHeader{Key: HeaderDLQTruncated, Value: []byte("true")},
			kgo.RecordHeader{Key: HeaderDLQOriginalBytes, Value: []byte(strconv.Itoa(len(dlq.Value)))})
		dlq.Value = dlq.Value[:max(limit, 0)]
	}
	r.log.Warn("dead-lettering event", "event_id", header(orig, HeaderEventID), "reason", reason, "dlq_topic", r.opts.DLQTopic, "source_lsn", src.LSN)
	r.client.Produce(context.Background(), dlq, func(_ *kgo.Record, err error) {
		r.release(size)
		if err != nil {
			r.fail(fmt.Errorf("write event %s to dead-letter topic %s: %w", header(orig, HeaderEventID), r.opts.DLQTopic, err))
			return
		}
		r.opts.Counters.DeadLettered.Add(1)
		if r.opts.Observer != nil {
			r.opts.Observer.DeadLettered(header(orig, HeaderEventType), class)
		}
		ack()
	})
}

func (r *Router) release(size int64) {
	r.limiter.Release(size)
	r.trackInFlight()
}

func (r *Router) trackInFlight() {
	recs, b := r.limiter.InFlight()
	r.opts.Counters.InFlightRecords.Store(recs)
	r.opts.Counters.InFlightBytes.Store(b)
}

// topicPrep is a topic's preparation under way: it outlives the short waits of Prepare, so that a
// slow CreateTopics or DescribeConfigs is not restarted on every retry.
type topicPrep struct {
	done  chan struct{}
	limit int32
	err   error
}

// topicPrepTimeout bounds one topic's preparation.
const topicPrepTimeout = 30 * time.Second

// prepareTopic makes sure topic exists (creating it if topic creation is on) and returns the largest
// batch it takes: the smaller of its max.message.bytes and kafka.max_message_bytes. It asks Kafka once
// per topic and router; while it waits, ctx may end and a later call picks the same work up.
func (r *Router) prepareTopic(ctx context.Context, topic string) (int32, error) {
	if v, ok := r.limits.Load(topic); ok {
		return v.(int32), nil
	}
	p, ok := r.preps[topic]
	if !ok {
		p = &topicPrep{done: make(chan struct{})}
		r.preps[topic] = p
		go func() {
			pctx, cancel := context.WithTimeout(r.closeCtx, topicPrepTimeout)
			defer cancel()
			p.limit, p.err = r.fetchTopic(pctx, topic)
			close(p.done)
		}()
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	delete(r.preps, topic)
	if p.err != nil {
		return 0, p.err
	}
	r.limits.Store(topic, p.limit)
	return p.limit, nil
}

// fetchTopic creates topic if topic creation is on and reads its max.message.bytes.
func (r *Router) fetchTopic(ctx context.Context, topic string) (int32, error) {
	if r.opts.CreateTopics {
		resp, err := r.admin.CreateTopic(ctx, r.opts.TopicPartitions, r.opts.TopicReplicationFactor, nil, topic)
		switch {
		case err == nil:
			r.log.Info("created topic", "topic", topic, "partitions", resp.NumPartitions, "replication_factor", resp.ReplicationFactor)
		case errors.Is(err, kerr.TopicAlreadyExists):
		default:
			return 0, fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	limit := r.opts.MaxMessageBytes
	configs, err := r.admin.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("read the configuration of topic %s: %w", topic, err)
		}
		r.log.Warn("cannot read the topic's max.message.bytes; assuming kafka.max_message_bytes", "topic", topic, "error", err.Error())
		return limit, nil
	}
	if rc, err := configs.On(topic, nil); err == nil && rc.Err == nil {
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if n, err := strconv.ParseInt(*c.Value, 10, 32); err == nil && n >= 1024 && int32(n) < limit {
				limit = int32(n)
			}
		}
	}
	return limit, nil
}

// Flush waits until every buffered record is acknowledged or ctx ends.
func (r *Router) Flush(ctx context.Context) error {
	if err := r.client.Flush(ctx); err != nil {
		return fmt.Errorf("flush kafka producer: %w", err)
	}
	return nil
}

// Close closes the Kafka client; records not yet acknowledged are failed and never acknowledged.
func (r *Router) Close() {
	r.closeFn()
	r.client.Close()
}

// kgoLogger sends franz-go's errors to slog. Its warnings repeat every second while a broker is
// down; the pipeline reports a stall once in a while instead.
type kgoLogger struct{ l *slog.Logger }

// Level implements kgo.Logger.
func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelError }

// Log implements kgo.Logger.
func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelWarn
	if level == kgo.LogLevelError {
		lvl = slog.LevelError
	}
	k.l.Log(context.Background(), lvl, "kafka client: "+msg, keyvals...)
}
