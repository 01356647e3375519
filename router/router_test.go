package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// failProduce makes the fake cluster answer every produce request for topic with errCode.
func failProduce(c *kfake.Cluster, topic string, errCode int16) {
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		hit := false
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			if rt.Topic != topic {
				continue
			}
			hit = true
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			st.TopicID = rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = errCode
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		if !hit {
			return nil, nil, false // let the fake broker handle it
		}
		return resp, nil, true
	})
}

// testRouter starts a router on the fake cluster c, closed when the test ends: routing by
// {event_type}, small in-flight caps, created topics of one partition; mutate adjusts the options.
func testRouter(t *testing.T, c *kfake.Cluster, mutate func(o *Options)) *Router {
	t.Helper()
	rules, err := NewRules(config.Routing{Topic: "{event_type}"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{
		Kafka:  config.Kafka{Brokers: c.ListenAddrs(), ClientID: "test", TopicPartitions: 1, TopicReplicationFactor: 1, MaxMessageBytes: 100000},
		Limits: config.Limits{MaxInFlightRecords: 10, MaxInFlightBytes: 1 << 20},
		Rules:  rules, Columns: defaultCols,
	}
	if mutate != nil {
		mutate(&o)
	}
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func newTestRouter(t *testing.T, c *kfake.Cluster, dlq string) (*Router, *Counters) {
	t.Helper()
	counters := new(Counters)
	r := testRouter(t, c, func(o *Options) {
		o.DLQTopic = dlq
		o.Counters = counters
		// Produce requests up to Kafka 3.9 name their topics, which failProduce matches on.
		o.ExtraOpts = []kgo.Opt{kgo.MaxVersions(kversion.V3_9_0())}
	})
	return r, counters
}

func row(eventType, id string) mapRow {
	return mapRow{"event_id": id, "event_type": eventType, "aggregate_id": "a1", "payload": `{"x":1}`}
}

func send(t *testing.T, r *Router, rw Row, ack func()) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := r.Prepare(ctx, rw, Source{LSN: 1})
	if err != nil {
		return err
	}
	r.Produce(p, ack)
	return nil
}

// TestFinalProduceErrorFailsWithoutAck: a non-retriable produce error must never acknowledge the
// record; the router fails so that the pipeline replays from the slot.
func TestFinalProduceErrorFailsWithoutAck(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	failProduce(c, "orders", kerr.TopicAuthorizationFailed.Code)
	r, _ := newTestRouter(t, c, "")
	var acked atomic.Int32
	if err := send(t, r, row("orders", "e1"), func() { acked.Add(1) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("router did not fail on a final produce error")
	}
	if !errors.Is(r.Err(), kerr.TopicAuthorizationFailed) {
		t.Fatalf("router error %v, want TopicAuthorizationFailed", r.Err())
	}
	if acked.Load() != 0 {
		t.Fatal("a failed record was acknowledged")
	}
	if err := send(t, r, row("orders", "e2"), func() {}); err == nil {
		t.Fatal("a failed router accepted another row")
	}
}

// rejectLargeBatches makes the fake cluster refuse, as a broker with a small max.message.bytes does,
// every produce to topic whose record batch is over limit bytes; requests with no such batch go to the
// fake broker as usual. Other partitions of a refused request get a retriable error.
func rejectLargeBatches(c *kfake.Cluster, topic string, limit int) {
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		hit := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				hit = hit || (rt.Topic == topic && len(rp.Records) > limit)
			}
		}
		if !hit {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotLeaderForPartition.Code
				if rt.Topic == topic && len(rp.Records) > limit {
					sp.ErrorCode = kerr.MessageTooLarge.Code
				}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// classes records the dead-letter classes an Observer is told of.
type classes struct {
	mu  sync.Mutex
	got []string
}

func (c *classes) Produced(string, string, int, time.Duration, time.Duration) {}
func (c *classes) DeadLettered(_, class string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, class)
}

// TestRejectedBatchIsolatesTheRecordAtFault: the broker refuses a batch that holds one oversized
// record among small ones, failing them all with the same error. The router must dead-letter none of
// them, but fail naming the transactions involved; replayed alone (IsolateUntil), only the record at
// fault is dead-lettered and its neighbours are delivered.
func TestRejectedBatchIsolatesTheRecordAtFault(t *testing.T) {
	t.Run("at-least-once", func(t *testing.T) { testRejectedBatchIsolates(t, false) })
	// In a Kafka transaction, the record that fails alone and its dead-letter record share the
	// transaction with its neighbours, and the transaction still commits.
	t.Run("exactly-once", func(t *testing.T) { testRejectedBatchIsolates(t, true) })
}

func testRejectedBatchIsolates(t *testing.T, transactional bool) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "dlq", "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rejectLargeBatches(c, "orders", 3000)
	rows := []mapRow{row("orders", "small-1"), row("orders", "big"), row("orders", "small-2")}
	rows[1]["payload"] = `{"blob": "` + strings.Repeat("b", 5000) + `"}`
	const commitLSN = 42

	newRouter := func(isolateUntil uint64, obs Observer) (*Router, *Counters) {
		counters := new(Counters)
		r := testRouter(t, c, func(o *Options) {
			o.Kafka.Linger = 50 * time.Millisecond
			o.DLQTopic = "dlq"
			o.Counters = counters
			o.Observer = obs
			o.IsolateUntil = isolateUntil
			if transactional {
				o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: 30 * time.Second}
			}
			o.ExtraOpts = []kgo.Opt{kgo.MaxVersions(kversion.V3_9_0()), kgo.ProducerBatchCompression(kgo.NoCompression())}
		})
		return r, counters
	}
	produceAll := func(r *Router, acked *atomic.Int32) {
		for _, rw := range rows {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			p, err := r.Prepare(ctx, rw, Source{LSN: 1, CommitLSN: commitLSN})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			r.Produce(p, func() { acked.Add(1) })
		}
	}

	// First session: the batch is refused; nothing is acknowledged or dead-lettered.
	first, counters := newRouter(0, nil)
	var acked atomic.Int32
	produceAll(first, &acked)
	select {
	case <-first.Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("router did not fail on a rejected batch")
	}
	var rejected *RejectedBatchError
	if !errors.As(first.Err(), &rejected) {
		t.Fatalf("router error %v, want a RejectedBatchError", first.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = first.Flush(ctx)
	cancel()
	if first.RejectedUpTo() != commitLSN {
		t.Fatalf("rejected up to %d, want %d", first.RejectedUpTo(), commitLSN)
	}
	if acked.Load() != 0 || counters.DeadLettered.Load() != 0 {
		t.Fatalf("first session acknowledged %d and dead-lettered %d records of a rejected batch", acked.Load(), counters.DeadLettered.Load())
	}

	// Replay alone: only the big record is dead-lettered.
	obs := &classes{}
	second, counters := newRouter(commitLSN, obs)
	acked.Store(0)
	produceAll(second, &acked)
	testWait(t, 20*time.Second, func() bool { return acked.Load() == 3 || second.Err() != nil })
	if err := second.Err(); err != nil {
		t.Fatalf("replay failed: %v", err)
	}
	if counters.Produced.Load() != 2 || counters.DeadLettered.Load() != 1 {
		t.Fatalf("replay produced %d and dead-lettered %d, want 2 and 1", counters.Produced.Load(), counters.DeadLettered.Load())
	}
	if transactional {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		if err := second.Commit(cctx, checkpoint.Record{LSN: commitLSN + 10}); err != nil {
			t.Fatalf("the replay's Kafka transaction did not commit: %v", err)
		}
		last, err := second.ReadCheckpoint(cctx)
		if err != nil || last == nil || last.LSN != commitLSN+10 || last.Records != 3 {
			t.Fatalf("checkpoint read back %+v (%v), want one at %d holding 3 records", last, err, commitLSN+10)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.got) != 1 || obs.got[0] != "rejected" {
		t.Fatalf("dead-letter classes %v, want [rejected]", obs.got)
	}
}

func testWait(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRefusedTopicsAreUndeliverable: a topic Kafka refuses to create (an invalid or colliding
// name), and a missing topic with creation off, make their rows dead letters with the reason —
// never a session that fails and replays forever.
func TestRefusedTopicsAreUndeliverable(t *testing.T) {
	tests := []struct {
		name, want string
		create     bool
		control    func(c *kfake.Cluster)
	}{
		{"collision refused at create", "kafka refused to create topic", true, func(c *kfake.Cluster) {
			c.ControlKey(int16(kmsg.CreateTopics), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				req := kreq.(*kmsg.CreateTopicsRequest)
				resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
				for _, rt := range req.Topics {
					st := kmsg.NewCreateTopicsResponseTopic()
					st.Topic, st.ErrorCode = rt.Topic, kerr.InvalidTopicException.Code
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})
		}},
		{"missing, creation off", "does not exist and kafka.create_topics is off", false, func(*kfake.Cluster) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tt.control(c)
			obs := &classes{}
			counters := new(Counters)
			r := testRouter(t, c, func(o *Options) {
				o.Kafka.CreateTopics = tt.create
				o.DLQTopic = "dlq"
				o.Counters = counters
				o.Observer = obs
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p, err := r.Prepare(ctx, row("a.b", "e1"), Source{LSN: 1})
			if err != nil {
				t.Fatalf("prepare: %v", err)
			}
			if p.Topic() != "" || !strings.Contains(p.dlqReason, tt.want) {
				t.Fatalf("prepared for topic %q with reason %q, want the dead-letter topic with a reason containing %q", p.Topic(), p.dlqReason, tt.want)
			}
			acked := make(chan struct{})
			r.Produce(p, func() { close(acked) })
			select {
			case <-acked:
			case <-time.After(20 * time.Second):
				t.Fatalf("not acknowledged through the dead-letter topic: %v", r.Err())
			}
		})
	}
}

// TestTopicSetupTimeoutIsNotTakenForAWait: a topic set-up that times out must come back as an error
// of its own, not as the caller's deadline (which the stream takes for "wait for room" and retries
// silently).
func TestTopicSetupTimeoutIsNotTakenForAWait(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.CreateTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		time.Sleep(2 * time.Second)
		return nil, nil, false
	})
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics = true
		o.TopicSetupTimeout = 300 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = r.Prepare(ctx, row("slow", "e1"), Source{})
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "slow") {
		t.Fatalf("got %v, want a topic set-up error naming the topic, not a context deadline", err)
	}
}

// TestUnroutableWithoutDLQNamesEvent: with no dead-letter topic an unroutable row stops the router
// with an error naming the event.
func TestUnroutableWithoutDLQNamesEvent(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, _ := newTestRouter(t, c, "")
	err = send(t, r, mapRow{"event_id": "e-null-type", "aggregate_id": "1", "payload": "{}"}, func() { t.Error("acknowledged") })
	var u *UndeliverableError
	if !errors.As(err, &u) || u.EventID != "e-null-type" {
		t.Fatalf("got %v, want an UndeliverableError naming e-null-type", err)
	}
	if !errors.As(r.Err(), &u) {
		t.Fatalf("router error %v", r.Err())
	}
}

// undecodedRow is a row whose decoder could not read a value the router reads.
type undecodedRow struct {
	mapRow
	problem string
}

func (r undecodedRow) Problem() string { return r.problem }

// TestUndecodableRowIsDeadLettered: a row with a value its decoder could not read is a dead letter
// with the reason and its event id; without a dead-letter topic it stops the router naming the event —
// never a session that replays to the same row forever.
func TestUndecodableRowIsDeadLettered(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	obs := &classes{}
	r := testRouter(t, c, func(o *Options) { o.DLQTopic = "dlq"; o.Observer = obs; o.Kafka.CreateTopics = true })
	bad := undecodedRow{row("Paid", "e-bad"), "column payload: bytea in hex format: encoding/hex: invalid byte"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := r.Prepare(ctx, bad, Source{LSN: 0x16B374D848})
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if p.Topic() != "" || !strings.Contains(p.dlqReason, "could not be decoded") || !strings.Contains(p.dlqReason, "column payload") {
		t.Fatalf("prepared for topic %q with reason %q, want the dead-letter topic with the decoding problem", p.Topic(), p.dlqReason)
	}
	acked := make(chan struct{})
	r.Produce(p, func() { close(acked) })
	select {
	case <-acked:
	case <-time.After(20 * time.Second):
		t.Fatalf("not acknowledged through the dead-letter topic: %v", r.Err())
	}
	obs.mu.Lock()
	if !slices.Equal(obs.got, []string{"undecodable"}) {
		t.Errorf("dead-letter classes %v, want [undecodable]", obs.got)
	}
	obs.mu.Unlock()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var lsn string
	for lsn == "" && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { lsn = header(r, outbox.HeaderDLQSourceLSN) })
	}
	if lsn != "16/B374D848" {
		t.Errorf("dead letter's %s header %q, want the row's WAL position 16/B374D848", outbox.HeaderDLQSourceLSN, lsn)
	}
	good := undecodedRow{row("Paid", "e-good"), ""}
	if p, err := r.Prepare(ctx, good, Source{LSN: 2}); err != nil || p.Topic() != "Paid" {
		t.Fatalf("a row without a problem went to %q (%v)", p.Topic(), err)
	}

	r2, _ := newTestRouter(t, c, "")
	err = send(t, r2, bad, func() { t.Error("acknowledged") })
	var u *UndeliverableError
	if !errors.As(err, &u) || u.EventID != "e-bad" || !strings.Contains(err.Error(), "column payload") {
		t.Fatalf("got %v, want an UndeliverableError naming e-bad and the column", err)
	}
}

// TestSourcePosition: a row's position is written as PostgreSQL writes an LSN; a snapshot's row
// names the snapshot.
func TestSourcePosition(t *testing.T) {
	for _, c := range []struct {
		src  Source
		want string
	}{
		{Source{}, "0/0"},
		{Source{LSN: 1}, "0/1"},
		{Source{LSN: 0x16B374D848}, "16/B374D848"},
		{Source{LSN: 0xFFFFFFFFFFFFFFFF}, "FFFFFFFF/FFFFFFFF"},
		{Source{LSN: 0x1000000000, Snapshot: true}, "snapshot@10/0"},
	} {
		if got := c.src.Position(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.src, got, c.want)
		}
	}
}

func TestLimiter(t *testing.T) {
	l := newLimiter(0, 2, 100, nil)
	ctx := context.Background()
	if err := l.Acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	// Bytes cap: 60 + 50 > 100.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := l.Acquire(short, 50); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire over the byte cap returned %v", err)
	}
	if err := l.Acquire(ctx, 40); err != nil {
		t.Fatal(err)
	}
	// Records cap: 2 in flight.
	got := make(chan error, 1)
	go func() { got <- l.Acquire(ctx, 1) }()
	select {
	case err := <-got:
		t.Fatalf("acquire over the record cap returned %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	l.Release(60)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if r, b, _ := l.InFlight(); r != 2 || b != 41 {
		t.Fatalf("in flight %d records %d bytes, want 2, 41", r, b)
	}
	// A record over the byte cap still goes when nothing else is in flight.
	l2 := newLimiter(0, 5, 10, nil)
	if err := l2.Acquire(ctx, 1000); err != nil {
		t.Fatal(err)
	}
}

// TestSlowTopicCreationIsNotRestarted: when creating a topic takes longer than one Prepare may wait,
// the next Prepare picks up the same creation instead of starting another one.
func TestSlowTopicCreationIsNotRestarted(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var creates atomic.Int32
	c.ControlKey(int16(kmsg.CreateTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		creates.Add(1)
		time.Sleep(1500 * time.Millisecond)
		return nil, nil, false
	})
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics = true
	})
	attempts := 0
	for {
		attempts++
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		p, err := r.Prepare(ctx, row("slowtopic", "e1"), Source{})
		cancel()
		if err == nil {
			acked := make(chan struct{})
			r.Produce(p, func() { close(acked) })
			select {
			case <-acked:
			case <-time.After(10 * time.Second):
				t.Fatal("record not acknowledged")
			}
			break
		}
		if !errors.Is(err, context.DeadlineExceeded) || attempts > 50 {
			t.Fatalf("attempt %d: %v", attempts, err)
		}
	}
	if attempts < 2 {
		t.Fatalf("the creation took %d attempt(s); the test needs it to outlast one", attempts)
	}
	if n := creates.Load(); n != 1 {
		t.Fatalf("%d CreateTopics requests over %d attempts, want 1", n, attempts)
	}
}

// TestMissingDeadLetterTopicFailsAtStart: with topic creation off, a dead-letter topic that does not
// exist is a configuration error at start, not a surprise on the first bad row.
func TestMissingDeadLetterTopicFailsAtStart(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := testRouter(t, c, func(o *Options) {
		o.DLQTopic = "no-such-dlq"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Ping(ctx); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "routing.dlq_topic") {
		t.Fatalf("ping: %v, want a configuration error naming routing.dlq_topic", err)
	}
}

// TestInFlightCountsRealSizes: a row far over kafka.max_message_bytes counts its real size against
// the byte cap while its dead-letter record is in flight, not the cap's.
func TestInFlightCountsRealSizes(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		time.Sleep(300 * time.Millisecond) // hold the acknowledgement so the in-flight figure can be read
		return nil, nil, false
	})
	r, counters := newTestRouter(t, c, "dlq")
	big := row("orders", "big")
	big["payload"] = strings.Repeat("p", 500000)
	acked := make(chan struct{})
	if err := send(t, r, big, func() { close(acked) }); err != nil {
		t.Fatal(err)
	}
	if n := counters.InFlightBytes.Load(); n < 500000 {
		t.Fatalf("in-flight bytes %d for a 500,000-byte row", n)
	}
	select {
	case <-acked:
	case <-time.After(20 * time.Second):
		t.Fatal("not acknowledged")
	}
}

// TestPartitionGrowthIsWarnedOnce: when a topic gains partitions while the router uses it, keys move;
// the router says so once.
func TestPartitionGrowthIsWarnedOnce(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var logs bytes.Buffer
	var mu sync.Mutex
	r := testRouter(t, c, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
		o.ExtraOpts = []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond), kgo.MetadataMaxAge(100 * time.Millisecond)}
	})
	sendAll := func(n int) {
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			rw := row("orders", fmt.Sprintf("e%d", i))
			rw["aggregate_id"] = fmt.Sprintf("key-%d", i)
			wg.Add(1)
			if err := send(t, r, rw, wg.Done); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
	}
	sendAll(5)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreatePartitions(context.Background(), 3, "orders"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the producer's metadata refreshes
	sendAll(40)
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "topic gained partitions"); n != 1 {
		t.Fatalf("warned %d times, want once:\n%s", n, logs.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFencedRouterCannotCommit: a second router of the same slot that fences (as a new instance does
// at start) leaves the first unable to commit its open transaction; its error says it was fenced,
// and the checkpoint read back is the second one's.
func TestFencedRouterCannotCommit(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slot := checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}
	newRouter := func() *Router {
		return testRouter(t, c, func(o *Options) {
			o.Transactions = &Transactions{Slot: slot, Topic: "checkpoints", Timeout: 30 * time.Second}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old := newRouter()
	if err := old.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int32
	if err := send(t, old, row("orders", "e1"), func() { acked.Add(1) }); err != nil {
		t.Fatal(err)
	}
	testWait(t, 10*time.Second, func() bool { return acked.Load() == 1 })

	next := newRouter()
	if err := next.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	err = old.Commit(ctx, checkpoint.Record{LSN: 100})
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("the fenced router's commit returned %v, want ErrFenced", err)
	}
	if err := next.Commit(ctx, checkpoint.Record{LSN: 50}); err != nil {
		t.Fatal(err)
	}
	last, err := next.ReadCheckpoint(ctx)
	if err != nil || last == nil || last.LSN != 50 {
		t.Fatalf("checkpoint read back %+v (%v), want the new router's at 50", last, err)
	}
}

// TestLingerIsWhatIsConfigured: kafka.linger 0 means no linger. franz-go's own default is 10 ms,
// so a router that passed nothing for 0 used to linger 10 ms on every record.
func TestLingerIsWhatIsConfigured(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for _, linger := range []time.Duration{0, 5 * time.Millisecond} {
		r := testRouter(t, c, func(o *Options) { o.Kafka.Linger = linger })
		if got := r.client.OptValue(kgo.ProducerLinger); got != linger {
			t.Errorf("kafka.linger %s: producer lingers %v", linger, got)
		}
	}
}

// TestNothingFollowsAFailure: once the router knows a produce failed for good, nothing more reaches
// Kafka before the session replays from the slot: records still buffered in the client (lingering) are
// aborted, and records prepared before the failure and produced after it are not sent — they would
// land ahead of the replay of the failed ones, and a consumer would see 11 before 6. (franz-go fails
// what it buffered for the failed partition itself; records produced between that and the failure's
// promise reaching the router may still be sent: see the README's Guarantees.)
func TestNothingFollowsAFailure(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := testRouter(t, c, func(o *Options) { o.Kafka.Linger = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var acked atomic.Int32
	for i := range 5 { // lingering in the client
		if err := send(t, r, row("orders", fmt.Sprintf("e%d", i)), func() { acked.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	late, err := r.Prepare(ctx, row("orders", "e5"), Source{LSN: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.fail(errors.New("kafka failed a batch for good")) // what the first failed promise does
	r.Produce(late, func() { acked.Add(1) })
	_ = r.Flush(ctx) // what the pipeline does before it closes the router
	r.Close()

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if end, _ := ends.Lookup("orders", 0); end.Offset != 0 || acked.Load() != 0 {
		t.Fatalf("after the failure %d records reached Kafka (%d acknowledged): they would overtake the replay", end.Offset, acked.Load())
	}
	if in, _, _ := r.limiter.InFlight(); in != 0 {
		t.Fatalf("%d records still count as in flight", in)
	}
}

// TestCheckpointReadIgnoresForgeriesAndFindsTheNewest: a record keyed like the slot that no Kafka
// transaction wrote (a plain producer's, as a row routed there would be in at-least-once mode) is
// not a checkpoint, whatever it says; and when partitions were added to the checkpoint topic, the
// slot's newest checkpoint is the one written last, whichever partition holds it.
func TestCheckpointReadIgnoresForgeriesAndFindsTheNewest(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slot := checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	written := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	write := func(partition int32, transactional bool, lsn checkpoint.LSN, at time.Time) {
		t.Helper()
		opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner())}
		if transactional {
			opts = append(opts, kgo.TransactionalID(fmt.Sprintf("writer-%d-%d", partition, lsn)))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		rec := &kgo.Record{Topic: "checkpoints", Partition: partition, Key: []byte(slot.String()),
			Value: checkpoint.Record{Slot: slot, LSN: lsn, Written: at}.Marshal()}
		if transactional {
			if err := cl.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if transactional {
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func() *checkpoint.Record {
		t.Helper()
		last, err := ReadCheckpoint(ctx, config.Kafka{Brokers: c.ListenAddrs(), ClientID: "test"}, "checkpoints", slot, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return last
	}
	write(0, true, 0x5000, written)
	write(0, false, 0xFFFF0000, written.Add(time.Hour)) // forged: a plain producer's record
	if last := read(); last == nil || last.LSN != 0x5000 {
		t.Fatalf("read %+v, want the transactional checkpoint at 0/5000, not the forgery", last)
	}
	write(1, true, 0x6000, written.Add(time.Minute))  // the key moved to another partition
	write(0, true, 0x5800, written.Add(-time.Minute)) // older, though later in its partition's log
	if last := read(); last == nil || last.LSN != 0x6000 {
		t.Fatalf("read %+v, want the checkpoint written last (0/6000), in the other partition", last)
	}
}

// TestTransactionTimeoutAboveTheBrokersIsAConfigurationError: a kafka.transaction_timeout above the
// brokers' transaction.max.timeout.ms is refused at every InitProducerID: retrying cannot help, so it
// is a configuration error naming the key, not a Kafka failure to retry forever.
func TestTransactionTimeoutAboveTheBrokersIsAConfigurationError(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.InitProducerID), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := kreq.(*kmsg.InitProducerIDRequest).ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.InvalidTransactionTimeout.Code
		return resp, nil, true
	})
	r := testRouter(t, c, func(o *Options) {
		o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: time.Hour}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = r.Fence(ctx)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "kafka.transaction_timeout") {
		t.Fatalf("fence returned %v, want a configuration error naming kafka.transaction_timeout", err)
	}
}

// TestCompressionAndTopicConfig: kafka.compression is the codec of the batches the router sends, and
// kafka.topic_config is the configuration of the topics it creates.
func TestCompressionAndTopicConfig(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := testRouter(t, c, func(o *Options) {
		o.Kafka.CreateTopics, o.Kafka.Compression = true, "zstd"
		o.Kafka.TopicConfig = map[string]string{"retention.ms": "1234567", "cleanup.policy": "delete"}
	})
	acked := make(chan struct{})
	big := row("configured", "e1")
	big["payload"] = strings.Repeat(`{"compressible": true}`, 500) // franz-go sends a batch that does not shrink as it is
	if err := send(t, r, big, func() { close(acked) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-acked:
	case <-time.After(20 * time.Second):
		t.Fatalf("not acknowledged: %v", r.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("configured"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	configs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "configured")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := configs.On("configured", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range rc.Configs {
		if c.Value != nil {
			got[c.Key] = *c.Value
		}
	}
	if got["retention.ms"] != "1234567" || got["cleanup.policy"] != "delete" {
		t.Errorf("created topic's configuration %v, want kafka.topic_config's", got)
	}
	var codec uint8 = 255
	for codec == 255 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { codec = rec.Attrs.CompressionType() })
	}
	if codec != 4 {
		t.Errorf("batch compression type %d, want 4 (zstd)", codec)
	}
}

// TestDeadLetterLogLineIsBounded: the reason of a dead letter quotes the row's values and the event id
// is a column's text, both of any size; the log line about it stays a line (reason and id bounded),
// while the dead-letter record keeps the event id whole.
func TestDeadLetterLogLineIsBounded(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var logged testenv.LogBuffer
	r := testRouter(t, c, func(o *Options) {
		o.DLQTopic = "dlq"
		o.Kafka.CreateTopics = true
		o.Logger = slog.New(slog.NewJSONHandler(&logged, nil))
	})
	id := "e-" + strings.Repeat("i", 50_000)
	bad := undecodedRow{row("Paid", id), "column payload: " + strings.Repeat("v", 50_000)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := r.Prepare(ctx, bad, Source{LSN: 1})
	if err != nil {
		t.Fatal(err)
	}
	acked := make(chan struct{})
	r.Produce(p, func() { close(acked) })
	select {
	case <-acked:
	case <-ctx.Done():
		t.Fatalf("not acknowledged through the dead-letter topic: %v", r.Err())
	}
	line := ""
	for _, l := range strings.Split(logged.String(), "\n") {
		if strings.Contains(l, "dead-lettering event") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no dead-lettering line in the log:\n%.2000s", logged.String())
	}
	if len(line) > maxReasonBytes+maxLoggedID+1024 {
		t.Errorf("the dead-lettering log line is %d bytes: want reason and event id bounded", len(line))
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := ""
	for got == "" && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = header(r, outbox.HeaderEventID) })
	}
	if got != id {
		t.Errorf("the dead-letter record's event id is %d bytes, want the whole %d", len(got), len(id))
	}
}
