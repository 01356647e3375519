package router

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// slowCreate makes the fake cluster take delay to answer a CreateTopics request for topic, or
// answer it with errCode when errCode is not zero.
func slowCreate(c *kfake.Cluster, topic string, delay time.Duration, errCode int16) {
	c.ControlKey(int16(kmsg.CreateTopics), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.CreateTopicsRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		// Asleep without holding the cluster: kfake runs control functions in its one loop, and a
		// plain sleep there would hold every other request (the other topics' produce requests too).
		c.SleepControl(func() { time.Sleep(delay) })
		if errCode == 0 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		st := kmsg.NewCreateTopicsResponseTopic()
		st.Topic, st.ErrorCode = topic, errCode
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
}

// ackLog records the order in which records were acknowledged.
type ackLog struct {
	mu  sync.Mutex
	ids []string
}

func (l *ackLog) ack(id string) func() {
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ids = append(l.ids, id)
	}
}

func (l *ackLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids...)
}

// prepareQuickly prepares rw and fails the test if that took longer than limit: with
// DeferNewTopics, a new topic must not hold the stream.
func prepareQuickly(t *testing.T, r *Router, rw Row, limit time.Duration) *Prepared {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	p, err := r.Prepare(ctx, rw, Source{LSN: 1, CommitLSN: 1})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > limit {
		t.Fatalf("Prepare of %v took %s: the stream waited for a new topic", rw, took.Round(time.Millisecond))
	}
	return p
}

// keyed is row with its own aggregate id (the Kafka key).
func keyed(eventType, id, key string) mapRow {
	rw := row(eventType, id)
	rw["aggregate_id"] = key
	return rw
}

// TestNewTopicDoesNotHoldOtherTopics: while a new topic is being created, records of other
// aggregates go to Kafka at once; the new topic's records wait, in order, behind the creation, and so
// do the later records of their aggregates on other topics (per aggregate, records are produced in
// commit order across topics too) — also the ones produced just as the creation ends.
func TestNewTopicDoesNotHoldOtherTopics(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "ready"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const creation = 1500 * time.Millisecond
	slowCreate(c, "fresh", creation, 0)
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics = true
		o.DeferNewTopics = true
		o.Limits.MaxInFlightRecords = 1000
	})
	var log ackLog
	first := prepareQuickly(t, r, keyed("ready", "o0", "other"), 5*time.Second) // the ready topic's own set-up
	r.Produce(first, log.ack("o0"))
	testWait(t, 10*time.Second, func() bool { return len(log.snapshot()) == 1 })

	start := time.Now()
	var fresh, shared []string // the new topic's records; every record of the aggregate they share
	for i := 1; time.Since(start) < creation+time.Second; i++ {
		n := strconv.Itoa(i)
		r.Produce(prepareQuickly(t, r, keyed("fresh", "f"+n, "shared"), 300*time.Millisecond), log.ack("f"+n))
		r.Produce(prepareQuickly(t, r, keyed("ready", "s"+n, "shared"), 300*time.Millisecond), log.ack("s"+n))
		r.Produce(prepareQuickly(t, r, keyed("ready", "o"+n, "other"), 300*time.Millisecond), log.ack("o"+n))
		fresh = append(fresh, "f"+n)
		shared = append(shared, "f"+n, "s"+n)
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	acks := log.snapshot()
	// Another aggregate's records written during the creation were acknowledged before any record
	// of the aggregate that waits.
	firstHeld := slices.IndexFunc(acks, func(id string) bool { return !strings.HasPrefix(id, "o") })
	if firstHeld < 0 {
		t.Fatalf("no record of the new topic's aggregate acknowledged: %v (router: %v)", acks, r.Err())
	}
	if firstHeld < 10 {
		t.Fatalf("only %d records of another aggregate went ahead of the new topic's creation: %v", firstHeld, acks)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("fresh", "ready"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	for len(got) < len(acks) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { got = append(got, rec) })
	}
	// The new topic's records are in Kafka in the order they were produced.
	var freshGot []string
	produced := map[string]time.Time{}
	for _, rec := range got {
		if rec.Topic == "fresh" {
			freshGot = append(freshGot, eventID(rec))
		}
		produced[eventID(rec)] = rec.Timestamp
	}
	if strings.Join(freshGot, ",") != strings.Join(fresh, ",") {
		t.Fatalf("new topic's records in Kafka %v, want %v", freshGot, fresh)
	}
	// The shared aggregate's records, across both topics, were produced in the order they came.
	for i := 1; i < len(shared); i++ {
		if produced[shared[i]].Before(produced[shared[i-1]]) {
			t.Fatalf("%s was produced at %s, before %s (%s), which came first", shared[i], produced[shared[i]].Format(time.StampMicro),
				shared[i-1], produced[shared[i-1]].Format(time.StampMicro))
		}
	}
}

// TestFailedNewTopicAcknowledgesNothing: a new topic whose creation fails (not a refusal of the name:
// an error that retrying may fix) fails the router, and the records held for it are never
// acknowledged, so the slot never passes them.
func TestFailedNewTopicAcknowledgesNothing(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Too few brokers for the replication factor: a broker coming back may fix it (unlike an
	// authorization failure, which falls back to the topics that exist).
	slowCreate(c, "denied", 300*time.Millisecond, kerr.InvalidReplicationFactor.Code)
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics = true
		o.DeferNewTopics = true
		o.DLQTopic = ""
	})
	var acked atomic.Int32
	for i := range 3 {
		r.Produce(prepareQuickly(t, r, row("denied", "d"+strconv.Itoa(i)), 200*time.Millisecond), func() { acked.Add(1) })
	}
	select {
	case <-r.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the router did not fail")
	}
	if err := r.Err(); !errors.Is(err, kerr.InvalidReplicationFactor) || !strings.Contains(err.Error(), "denied") {
		t.Fatalf("router error %v, want the creation's error naming the topic", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.Flush(ctx)
	if n := acked.Load(); n != 0 {
		t.Fatalf("%d records of a topic that could not be set up were acknowledged", n)
	}
	if recs, _, _ := r.limiter.InFlight(); recs != 0 {
		t.Fatalf("%d records still hold room", recs)
	}
}

// TestRefusedNewTopicDeadLettersHeldRecords: a new topic Kafka refuses (an invalid name) turns the
// records held for it into dead letters with the reason, as without deferral.
func TestRefusedNewTopicDeadLettersHeldRecords(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slowCreate(c, "bad", 300*time.Millisecond, kerr.InvalidTopicException.Code)
	obs := &classes{}
	counters := new(Counters)
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics = true
		o.DeferNewTopics = true
		o.DLQTopic = "dlq"
		o.Counters = counters
		o.Observer = obs
	})
	var acked atomic.Int32
	for i := range 3 {
		r.Produce(prepareQuickly(t, r, row("bad", "b"+strconv.Itoa(i)), 200*time.Millisecond), func() { acked.Add(1) })
	}
	testWait(t, 10*time.Second, func() bool { return acked.Load() == 3 || r.Err() != nil })
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if n := counters.DeadLettered.Load(); n != 3 {
		t.Fatalf("%d dead letters, want 3", n)
	}
}

// TestCommitTakesHeldRecords: in exactly-once mode a commit holds the records waiting for a new
// topic: once Commit returns, they are in the committed transaction.
func TestCommitTakesHeldRecords(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slowCreate(c, "fresh", time.Second, 0)
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics = true
		o.DeferNewTopics = true
		o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: 30 * time.Second}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int32
	for i := range 3 {
		r.Produce(prepareQuickly(t, r, row("fresh", "f"+strconv.Itoa(i)), 200*time.Millisecond), func() { acked.Add(1) })
	}
	if err := r.Commit(ctx, checkpoint.Record{LSN: 100}); err != nil {
		t.Fatal(err)
	}
	if n := acked.Load(); n != 3 {
		t.Fatalf("%d of 3 held records acknowledged when the commit returned", n)
	}
}
