// Topics: what the router learns of each topic it routes to, once per router — created when missing
// (kafka.create_topics, within kafka.max_new_topics_per_hour), its partitions and limits read — and
// the records held in order while a new topic is set up in the background (Options.DeferNewTopics).

package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// topicInfo is what the router learned of a topic.
type topicInfo struct {
	// limit is the largest batch the topic takes: the smaller of its max.message.bytes and ours.
	limit int32
	// partitions is the partition count when the router first used the topic; 0 if unknown.
	partitions int32
	// refused, when not empty, says why no record can ever go to the topic; with transient, only
	// for now (the hour's topic creations are used up): the topic is looked at again for the next row.
	refused   string
	transient bool
	// grew is set once the topic was seen with more partitions (warned once); lastKey is the key of
	// the last record produced to it, for the warning's example.
	grew    *atomic.Bool
	lastKey *atomic.Pointer[[]byte]
	// stamps bound the records' timestamps; restamped is set once a record of the topic had to
	// carry its produce time instead (warned once).
	stamps    stampLimits
	restamped *atomic.Bool
}

// reserved returns the room p holds under the byte cap, to be released once, when p is acknowledged or
// given up: the record's bytes, and its block's when p is the block's last record in flight.
func (p *Prepared) reserved() int64 { return p.size + p.block.Release() }

// topicProblem says why rec, of size bytes, can never go to its topic, or nil.
func topicProblem(rec *kgo.Record, size int, info topicInfo) (problem error, class string) {
	switch {
	case info.refused != "":
		return &undeliverable{reason: info.refused}, "unroutable"
	case placed(rec) && info.partitions > 0 && rec.Partition >= info.partitions:
		return &undeliverable{reason: fmt.Sprintf("the row names partition %d (kafka.debezium.additional_placement) but topic %s has %d partitions", rec.Partition, rec.Topic, info.partitions)}, "unroutable"
	case size > int(info.limit):
		return &undeliverable{reason: fmt.Sprintf("record of %d bytes (key, value, headers and batch framing) exceeds max.message.bytes of topic %s (%d)", size, rec.Topic, info.limit)}, "too_large"
	}
	return nil, ""
}

// readyTopic returns what the router learned of topic, once it is prepared.
func (r *Router) readyTopic(topic string) (topicInfo, bool) {
	if v, ok := r.topics.Load(topic); ok {
		return v.(topicInfo), true
	}
	return topicInfo{}, false
}

// topicPrep is a topic's preparation under way: it outlives the short waits of Prepare, so that a
// slow CreateTopics or DescribeConfigs is not restarted on every retry.
type topicPrep struct {
	topic string
	done  chan struct{} // closed once info and err are set
	info  topicInfo
	err   error
	open  bool // under Router.prepMu: the preparation has not ended
}

// waitingRecord is a record, with its acknowledgement, produced later: waiting for its topic or
// behind a waiting record of its key (Router.waiting), or for the next Kafka transaction
// (Router.queued).
type waitingRecord struct {
	p   *Prepared
	ack func()
}

// startPrep returns topic's preparation, starting it if none is under way. It runs in the
// background, within the topic set-up timeout.
func (r *Router) startPrep(topic string) *topicPrep {
	r.prepMu.Lock()
	defer r.prepMu.Unlock()
	if p, ok := r.preps[topic]; ok {
		return p
	}
	p := &topicPrep{topic: topic, done: make(chan struct{}), open: true}
	r.preps[topic] = p
	go r.runPrep(p)
	return p
}

// runPrep prepares p's topic and then lets the records waiting for it go.
func (r *Router) runPrep(p *topicPrep) {
	pctx, cancel := context.WithTimeout(r.closeCtx, r.opts.TopicSetupTimeout)
	info, err := r.fetchTopic(pctx, p.topic)
	cancel()
	if err != nil {
		r.log.Warn("topic set-up failed; the session stops and retries", "topic", p.topic, "error", err.Error())
	} else {
		info.grew, info.restamped, info.lastKey = new(atomic.Bool), new(atomic.Bool), new(atomic.Pointer[[]byte])
		switch {
		case info.transient:
			r.limitReached.Do(func() {
				r.log.Warn("kafka.max_new_topics_per_hour reached: rows for topics that do not exist yet are dead-lettered with the reason until fewer were created in the last hour",
					"limit", r.opts.Kafka.MaxNewTopicsPerHour, "topic", p.topic)
			})
		case info.refused != "":
			r.log.Warn("topic refused: records routed to it are undeliverable", "topic", p.topic, "reason", info.refused)
		}
	}
	r.prepMu.Lock()
	p.info, p.err, p.open = info, err, false
	delete(r.preps, p.topic)
	if err == nil && !info.transient {
		r.topics.Store(p.topic, info)
	}
	r.prepMu.Unlock()
	close(p.done)
	r.releaseWaiting()
}

// hold queues p, and reports true, if it must wait: its topic is still being prepared, or an earlier
// record of its key waits (per aggregate, records go to Kafka in commit order across topics too).
// Produce's goroutine only.
func (r *Router) hold(p *Prepared, ack func()) bool {
	if p.prep == nil && r.waitingCount.Load() == 0 {
		return false // nothing waits; only this goroutine adds to the queue
	}
	r.prepMu.Lock()
	defer r.prepMu.Unlock()
	key := string(p.rec.Key)
	if (p.prep == nil || !p.prep.open) && r.keyWaiting[key] == 0 {
		return false
	}
	r.waiting = append(r.waiting, waitingRecord{p: p, ack: ack})
	r.keyWaiting[key]++
	r.waitingCount.Add(1)
	return true
}

// releaseWaiting produces, in order, the waiting records whose topic is ready and before which no
// record of their key waits, until none is left that may go. One release runs at a time, so a
// key's records leave in the order they came.
func (r *Router) releaseWaiting() {
	r.releaseMu.Lock()
	defer r.releaseMu.Unlock()
	for {
		r.prepMu.Lock()
		var out []waitingRecord
		blocked := map[string]bool{}
		rest := r.waiting[:0]
		for _, h := range r.waiting {
			key := string(h.p.rec.Key)
			if blocked[key] || (h.p.prep != nil && h.p.prep.open) {
				blocked[key] = true
				rest = append(rest, h)
				continue
			}
			out = append(out, h)
		}
		clear(r.waiting[len(rest):])
		r.waiting = rest
		r.prepMu.Unlock()
		if len(out) == 0 {
			return
		}
		for _, h := range out {
			if err := r.Err(); err != nil {
				// Never acknowledged: the session replays it.
				r.release(h.p.reserved())
				endSpan(h.p.span, h.p.rec, err)
				continue
			}
			r.produce(h.p, h.ack)
		}
		// Their keys stay held until they are handed to Kafka: a record of the same key produced
		// meanwhile waited, and goes in the next round.
		r.prepMu.Lock()
		for _, h := range out {
			key := string(h.p.rec.Key)
			if r.keyWaiting[key]--; r.keyWaiting[key] == 0 {
				delete(r.keyWaiting, key)
			}
		}
		r.prepMu.Unlock()
		r.waitingCount.Add(-int64(len(out)))
	}
}

// drainWaiting waits until every waiting record was handed to Kafka (or dropped by a failure), or ctx
// ends.
func (r *Router) drainWaiting(ctx context.Context) error {
	for r.waitingCount.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for new topics: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// prepareTopic makes sure topic exists (creating it if topic creation is on) and learns what it
// takes, or why it can take nothing, waiting within ctx. It asks Kafka once per topic and router;
// if ctx ends first, a later call picks the same work up. A failed preparation is logged and
// returned as an error that is not ctx's, so that callers waiting for room do not take it for their
// own deadline.
func (r *Router) prepareTopic(ctx context.Context, topic string) (topicInfo, error) {
	if info, ok := r.readyTopic(topic); ok {
		return info, nil
	}
	p := r.startPrep(topic)
	select {
	case <-p.done:
	case <-ctx.Done():
		return topicInfo{}, ctx.Err()
	}
	if p.err != nil {
		return topicInfo{}, p.err
	}
	return p.info, nil
}

// waitTopicLeaders waits, within ctx, until every partition of a topic just created has a leader that
// serves it. The producer's first look at a topic that is not there yet fails, and franz-go then waits
// its metadata minimum age (5 s) before looking again; so does a produce that a leader refuses with
// NOT_LEADER_FOR_PARTITION because it has not loaded the partition yet, although the metadata already
// names it. Either way the first records of every new topic would wait that long (in exactly-once
// mode, with the stream held by the commit). Listing the end offsets asks the leaders themselves, so
// the wait ends only when each one answers for its partition.
func (r *Router) waitTopicLeaders(ctx context.Context, topic string) {
	for {
		if r.topicServed(ctx, topic) {
			return
		}
		select {
		case <-ctx.Done():
			return // the producer retries on its own
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// topicServed reports whether the metadata shows a leader for every partition of topic and every
// leader answers a ListOffsets request for its partition.
func (r *Router) topicServed(ctx context.Context, topic string) bool {
	details, err := r.admin.ListTopics(ctx, topic)
	if err != nil {
		return false
	}
	d, ok := details[topic]
	if !ok || d.Err != nil || len(d.Partitions) == 0 {
		return false
	}
	for _, p := range d.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	ends, err := r.admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return false
	}
	served := 0
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			served++
		}
	})
	return served == len(d.Partitions)
}

// existingTopicWait bounds the wait for the leaders of a topic that already existed.
const existingTopicWait = 5 * time.Second

// errTopicSetupTimeout replaces a context deadline in topic set-up errors.
var errTopicSetupTimeout = errors.New("no answer within the topic set-up timeout")

// fetchTopic creates topic if topic creation is on, and reads its partition count and
// max.message.bytes. A topic Kafka will never take (an invalid or colliding name, or a missing topic
// that may not be created) is reported in topicInfo.refused, not as an error.
func (r *Router) fetchTopic(ctx context.Context, topic string) (topicInfo, error) {
	info := topicInfo{limit: r.opts.Kafka.MaxMessageBytes, stamps: defaultStampLimits()}
	wrap := func(what string, err error) error {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			err = errTopicSetupTimeout
		}
		return fmt.Errorf("%s topic %s: %w", what, topic, err)
	}
	mayCreate, limited := r.opts.Kafka.CreateTopics, false
	if mayCreate && !r.opts.TopicCreations.take(time.Now()) {
		mayCreate, limited = false, true
	}
	if mayCreate {
		resp, err := r.admin.CreateTopic(ctx, r.opts.Kafka.TopicPartitions, r.opts.Kafka.TopicReplicationFactor, TopicConfigs(r.opts.Kafka), topic)
		switch {
		case err == nil:
			r.log.Info("created topic", "topic", topic, "partitions", resp.NumPartitions, "replication_factor", resp.ReplicationFactor)
			info.partitions = resp.NumPartitions
			r.waitTopicLeaders(ctx, topic)
		case errors.Is(err, kerr.TopicAlreadyExists):
			r.opts.TopicCreations.refund()
		case errors.Is(err, kerr.InvalidTopicException):
			r.opts.TopicCreations.refund()
			info.refused = fmt.Sprintf("kafka refused to create topic %s (an invalid name, or one colliding with an existing topic when '.' and '_' are taken as equal): %v", topic, err)
			return info, nil
		case deniedCreate(err):
			// Kafka checks CREATE before it checks whether the topic exists: a principal that may
			// write existing topics but not create them meets this for every topic. An existing one
			// is used; a missing one is refused as with kafka.create_topics off.
			r.opts.TopicCreations.refund()
			mayCreate = false
			r.noteCreateDenied(err)
		case errors.Is(err, kerr.InvalidConfig), errors.Is(err, kerr.PolicyViolation):
			// The configuration asks for what the cluster refuses: no retry changes it.
			return info, fmt.Errorf("%w: %w", ErrConfig, wrap("create", CreateTopicHint(err, r.opts.Kafka)))
		default:
			return info, wrap("create", CreateTopicHint(err, r.opts.Kafka))
		}
	}
	if info.partitions == 0 {
		details, err := r.admin.ListTopics(ctx, topic)
		if err != nil {
			return info, wrap("look up", err)
		}
		d, ok := details[topic]
		switch {
		case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			if !r.opts.Kafka.CreateTopics {
				info.refused = fmt.Sprintf("topic %s does not exist and kafka.create_topics is off", topic)
				return info, nil
			}
			if limited {
				info.refused = fmt.Sprintf("topic %s does not exist and the router created kafka.max_new_topics_per_hour (%d) topics in the last hour: a routing column with values no one planned creates a topic per value; "+
					"create the topic, or raise the limit", topic, r.opts.Kafka.MaxNewTopicsPerHour)
				info.transient = true
				return info, nil
			}
			if !mayCreate {
				info.refused = fmt.Sprintf("topic %s does not exist and Kafka refuses this principal the right to create it (CREATE on the topic or the cluster): create it, or grant CREATE", topic)
				return info, nil
			}
		case errors.Is(d.Err, kerr.InvalidTopicException):
			info.refused = fmt.Sprintf("kafka refused topic %s: %v", topic, d.Err)
			return info, nil
		case d.Err != nil:
			return info, wrap("look up", d.Err)
		default:
			info.partitions = int32(len(d.Partitions))
			// A topic that someone else created a moment ago may not be served by its leaders
			// yet; a produce would then wait franz-go's metadata minimum age (5 s). Asking costs
			// one round trip; a topic whose partition stays leaderless is left to the producer.
			wctx, cancel := context.WithTimeout(ctx, existingTopicWait)
			r.waitTopicLeaders(wctx, topic)
			cancel()
		}
	}
	configs, err := r.admin.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		if ctx.Err() != nil {
			return info, wrap("read the configuration of", err)
		}
		r.log.Warn("cannot read the topic's max.message.bytes; assuming kafka.max_message_bytes", "topic", topic, "error", err.Error())
		return info, nil
	}
	if rc, err := configs.On(topic, nil); err == nil && rc.Err == nil {
		info.stamps = stampLimits{}
		for _, c := range rc.Configs {
			if c.Value == nil {
				continue
			}
			info.stamps.set(c.Key, *c.Value)
			if c.Key != "max.message.bytes" {
				continue
			}
			if n, err := strconv.ParseInt(*c.Value, 10, 32); err == nil && n >= 1024 && int32(n) < info.limit {
				info.limit = int32(n)
			}
		}
	}
	return info, nil
}

// deniedCreate reports Kafka's refusal of CREATE to the principal.
func deniedCreate(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// noteCreateDenied says once per router that the principal may not create topics, so that the
// operator knows why missing topics' rows are dead-lettered.
func (r *Router) noteCreateDenied(err error) {
	r.createDenied.Do(func() {
		r.log.Warn("Kafka refuses this principal the right to create topics (CREATE): existing topics are used, rows for missing ones are dead-lettered with the reason; create the topics yourself and set kafka.create_topics: false, or grant CREATE",
			"error", err.Error())
	})
}

// TopicConfigs is kafka.topic_config for CreateTopics (nil when empty: Kafka's defaults).
func TopicConfigs(k config.Kafka) map[string]*string {
	if len(k.TopicConfig) == 0 {
		return nil
	}
	out := make(map[string]*string, len(k.TopicConfig))
	for name, v := range k.TopicConfig {
		out[name] = &v
	}
	return out
}

// CreationLimit bounds the topics a router creates per hour (kafka.max_new_topics_per_hour): a
// column that routes to a topic per value, with values no one planned (a made-up event type per
// row), would otherwise create topics without end. It outlives the routers of a pipeline's sessions.
// Safe for concurrent use; a nil *CreationLimit is no limit.
type CreationLimit struct {
	mu    sync.Mutex
	max   int
	times []time.Time // the creations of the last hour, oldest first
}

// NewCreationLimit returns a limit of max topics per hour; max 0 is no limit (nil).
func NewCreationLimit(max int) *CreationLimit {
	if max <= 0 {
		return nil
	}
	return &CreationLimit{max: max}
}

// take counts one creation now, or reports false when the hour's creations are used up.
func (l *CreationLimit) take(now time.Time) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for i < len(l.times) && now.Sub(l.times[i]) >= time.Hour {
		i++
	}
	l.times = l.times[i:]
	if len(l.times) >= l.max {
		return false
	}
	l.times = append(l.times, now)
	return true
}

// refund gives back the last creation taken (the topic existed after all).
func (l *CreationLimit) refund() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.times); n > 0 {
		l.times = l.times[:n-1]
	}
}
