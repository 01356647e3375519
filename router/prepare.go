// A row to a record: Prepare resolves a row's topic (the rules of its outbox table), builds its key,
// value, headers and timestamp in the configured format, and says why a row can never be delivered;
// Plan does the same without Kafka, for dry runs.

package router

import (
	"context"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/pin"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
)

// Prepared is a routed record that holds its room under the in-flight caps until it is acknowledged.
type Prepared struct {
	rec       *kgo.Record
	size      int64
	src       Source
	alone     bool   // produced alone: a rejection proves the record itself is at fault
	dlqReason string // non-empty: the record goes to the dead-letter topic for this reason
	dlqClass  string
	typ       string // the event type, for the metrics' labels
	span      trace.Span
	row       Row // kept only while the topic is prepared (prep)
	// prep is set when the record's topic was not ready at Prepare (Options.DeferNewTopics): the
	// checks that need the topic, the timestamp and the span wait until it is.
	prep *topicPrep
	// space holds rec when the router built it (not a Debezium-format record): one allocation per row.
	space recordWithHeaders
	// block is the memory the row shares with the rows read before and after it (nil: its own): the
	// record keeps it alive until acknowledged, so the first record of a block in flight charges it
	// to the byte cap and the last one gives it back (reserved).
	block *pin.Block
}

// blockRow is a Row carved from a block of memory shared with other rows (replication.Row).
type blockRow interface {
	Block() *pin.Block
}

// eventType is t as a string, interned (see Router.types).
func (r *Router) eventType(t []byte) string {
	r.typesMu.Lock()
	defer r.typesMu.Unlock()
	if s, ok := r.types[string(t)]; ok {
		return s
	}
	s := string(t)
	if r.types == nil || len(r.types) >= maxResolved {
		r.types = make(map[string]string)
	}
	r.types[s] = s
	return s
}

// Prepare routes row and takes room for it under the in-flight caps, blocking while they are reached.
// If ctx ends first it returns ctx's error and holds nothing. It returns the router's failure once
// there is one, and an *UndeliverableError for a row that can never be delivered when no
// dead-letter topic is set.
func (r *Router) Prepare(ctx context.Context, row Row, src Source) (*Prepared, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	p := new(Prepared)
	rec, size, problem, class := resolve(&p.space, r.rulesFor(row), r.opts.Columns, r.opts.Format, row, r.opts.Kafka.MaxMessageBytes)
	alone := r.opts.IsolateUntil > 0 && src.CommitLSN != 0 && src.CommitLSN <= r.opts.IsolateUntil
	var info topicInfo
	var prep *topicPrep
	if problem == nil {
		ready := false
		if info, ready = r.readyTopic(rec.Topic); !ready {
			if r.opts.DeferNewTopics && !alone {
				prep = r.startPrep(rec.Topic)
			} else {
				var err error
				if info, err = r.prepareTopic(ctx, rec.Topic); err != nil {
					return nil, err
				}
			}
		}
		if prep == nil {
			problem, class = topicProblem(rec, size, info)
		}
	}
	var span trace.Span
	if problem == nil {
		if prep == nil {
			r.stamp(rec, row, src, info)
		}
		if r.opts.Tracer != nil {
			span = r.startSpan(rec, src)
			size = recordSize(rec)
		}
	}
	// The real size counts against the byte cap, however large: a record over the cap waits until
	// nothing else is in flight and then goes alone.
	p.rec, p.src, p.size, p.span, p.prep = rec, src, int64(size), span, prep
	if t, ok := row.Value(r.opts.Columns.EventType); ok && r.opts.Columns.EventType != "" {
		p.typ = r.eventType(t)
	}
	if prep != nil {
		// The row is kept for the timestamp, which needs the topic's bounds.
		p.row = row
	}
	if problem != nil {
		if r.opts.DLQTopic == "" {
			err := &UndeliverableError{EventID: eventID(rec), Reason: problem.Error(), CommitLSN: src.CommitLSN}
			r.fail(err)
			return nil, err
		}
		p.dlqReason, p.dlqClass = problem.Error(), class
	}
	p.alone = alone
	if b, ok := row.(blockRow); ok {
		p.block = b.Block()
	}
	// A record keeps its row's whole block alive: the first of a block in flight charges it.
	block := p.block.Hold()
	var err error
	if p.alone || r.lastAlone {
		err = r.limiter.AcquireAlone(ctx, p.size+block)
	} else {
		err = r.limiter.Acquire(ctx, p.size+block)
	}
	if err != nil {
		// Nothing of p was charged. If the block's records in flight were all acknowledged while p
		// waited, p is the last holder of what they charged: it is given back.
		if give := p.block.Release() - block; give > 0 {
			r.limiter.ReleaseBytes(give)
			r.trackInFlight()
		}
		return nil, err
	}
	r.lastAlone = p.alone
	r.trackInFlight()
	return p, nil
}

// stamp sets rec's Kafka timestamp (recordTime), or leaves it to the produce time when the topic
// would refuse it or delete the record too soon, which it logs once per topic.
func (r *Router) stamp(rec *kgo.Record, row Row, src Source, info topicInfo) {
	t, why := info.stamps.fit(recordTime(row, r.opts.Columns, r.opts.Kafka.RecordTimestamp, src), time.Now())
	rec.Timestamp = t
	if why != "" && info.restamped != nil && info.restamped.CompareAndSwap(false, true) {
		r.log.Warn("records carry their produce time instead of their own timestamp: the topic would refuse or soon delete them (logged once per topic)",
			"topic", rec.Topic, "event_id", eventID(rec), "reason", why)
	}
}

// Topic is where the prepared record goes, or "" when it goes to the dead-letter topic.
func (p *Prepared) Topic() string {
	if p.dlqReason != "" {
		return ""
	}
	return p.rec.Topic
}

// tableRow is a Row that says which outbox table it comes from (replication.Row does).
type tableRow interface {
	OutboxTable() int
}

// rulesFor returns the rules that route row: those of its outbox table.
func (r *Router) rulesFor(row Row) *Rules {
	if tr, ok := row.(tableRow); ok {
		if i := tr.OutboxTable(); i > 0 && i <= len(r.opts.TableRules) {
			return r.opts.TableRules[i-1]
		}
	}
	return r.opts.Rules
}

// resolve builds the record for row with its topic and size, or says why the row can never be
// delivered (problem) and the class of that reason.
// The record is made in space (nil: a new one).
func resolve(space *recordWithHeaders, rules *Rules, cols config.Columns, f Format, row Row, maxMessageBytes int32) (rec *kgo.Record, size int, problem error, class string) {
	rec, problem = buildRecordIn(space, row, cols, f)
	class = "unroutable"
	if pr, ok := row.(problemRow); ok {
		// The row's own problem is the cause of any the record's building found.
		if p := pr.Problem(); p != "" {
			problem, class = &undeliverable{reason: "a value could not be decoded: " + p}, "undecodable"
			if cp, ok := row.(classedProblemRow); ok && cp.ProblemClass() != "" {
				problem, class = &undeliverable{reason: p}, cp.ProblemClass()
			}
		}
	}
	if rec == nil {
		// A format that could not build the record at all: the dead-letter record keeps the payload.
		rec = space.init()
		if v, ok := row.Value(cols.Payload); ok {
			rec.Value = v
		}
	}
	if problem == nil {
		rec.Topic, problem = rules.Topic(row)
	}
	size = recordSize(rec)
	if problem == nil && size > int(maxMessageBytes) {
		problem = &undeliverable{reason: fmt.Sprintf("record of %d bytes (key, value, headers and batch framing) exceeds kafka.max_message_bytes (%d)", size, maxMessageBytes)}
		class = "too_large"
	}
	return rec, size, problem, class
}

// problemRow is a Row that may hold a value its decoder could not read (replication.Row does): it
// cannot be delivered as it is.
type problemRow interface {
	Problem() string
}

// classedProblemRow is a problemRow whose problem has a class of its own (replication.Row's
// messages that cannot become records: "bad_message"), its reason then complete as it is.
type classedProblemRow interface {
	ProblemClass() string
}

// Plan says where row would go without sending it: its topic, or why it can never be delivered.
// Dry runs use it.
func Plan(rules *Rules, cols config.Columns, f Format, row Row, maxMessageBytes int32) (topic string, problem error) {
	rec, _, problem, _ := resolve(nil, rules, cols, f, row, maxMessageBytes)
	return rec.Topic, problem
}
