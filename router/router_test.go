package router

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
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

func newTestRouter(t *testing.T, c *kfake.Cluster, dlq string) (*Router, *Counters) {
	t.Helper()
	rules, err := NewRules("{event_type}", nil, "", defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	counters := new(Counters)
	r, err := New(Options{
		Brokers: c.ListenAddrs(), ClientID: "test", Rules: rules, Columns: defaultCols, DLQTopic: dlq,
		MaxMessageBytes: 100000, MaxInFlightRecords: 10, MaxInFlightBytes: 1 << 20, Counters: counters,
		// Produce requests up to Kafka 3.9 name their topics, which failProduce matches on.
		ExtraOpts: []kgo.Opt{kgo.MaxVersions(kversion.V3_9_0())},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, counters
}

func row(eventType, id string) mapRow {
	return mapRow{"event_id": id, "event_type": eventType, "aggregate_id": "a1", "payload": `{"x":1}`}
}

func send(t *testing.T, r *Router, rw Row, ack func()) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := r.Prepare(ctx, rw, Source{LSN: "0/1"})
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

// TestBrokerRejectedRecordIsDeadLettered: a record the broker rejects as too large goes to the
// dead-letter topic and only then counts as acknowledged.
func TestBrokerRejectedRecordIsDeadLettered(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	failProduce(c, "orders", kerr.MessageTooLarge.Code)
	r, counters := newTestRouter(t, c, "dlq")
	acked := make(chan struct{}, 1)
	if err := send(t, r, row("orders", "e1"), func() { acked <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-acked:
	case <-r.Failed():
		t.Fatalf("router failed: %v", r.Err())
	case <-time.After(20 * time.Second):
		t.Fatal("rejected record was never acknowledged through the dead-letter topic")
	}
	if counters.DeadLettered.Load() != 1 || counters.Produced.Load() != 0 {
		t.Fatalf("dead-lettered %d, produced %d; want 1, 0", counters.DeadLettered.Load(), counters.Produced.Load())
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

func TestLimiter(t *testing.T) {
	l := newLimiter(2, 100)
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
	if r, b := l.InFlight(); r != 2 || b != 41 {
		t.Fatalf("in flight %d records %d bytes, want 2, 41", r, b)
	}
	// A record over the byte cap still goes when nothing else is in flight.
	l2 := newLimiter(5, 10)
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
	rules, err := NewRules("{event_type}", nil, "", defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Options{Brokers: c.ListenAddrs(), ClientID: "test", Rules: rules, Columns: defaultCols, CreateTopics: true,
		TopicPartitions: 1, TopicReplicationFactor: 1, MaxMessageBytes: 100000, MaxInFlightRecords: 10, MaxInFlightBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
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
