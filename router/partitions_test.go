package router

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestGrownTopicIsWarnedOnce: partitions added to a topic the router writes are noticed by its
// periodic check (the producer itself learns of them only with its metadata, minutes later) and
// warned of once, with the partition counts and where the last key went before and goes now.
func TestGrownTopicIsWarnedOnce(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "Paid"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var logged testenv.LogBuffer
	r := testRouter(t, c, func(o *Options) {
		o.PartitionCheckInterval = 50 * time.Millisecond
		o.Logger = slog.New(slog.NewJSONHandler(&logged, nil))
	})
	acked := make(chan struct{}, 1)
	if err := send(t, r, row("Paid", "e1"), func() { acked <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	<-acked
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(logged.String(), "gained partitions") {
		t.Fatal("warned before the topic grew")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).UpdatePartitions(context.Background(), 8, "Paid"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the warning", func() bool { return strings.Contains(logged.String(), "gained partitions") })
	time.Sleep(300 * time.Millisecond)
	var lines []map[string]any
	for _, l := range strings.Split(logged.String(), "\n") {
		if strings.Contains(l, "gained partitions") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("warned %d times, want once", len(lines))
	}
	w := lines[0]
	if w["topic"] != "Paid" || w["partitions_before"] != 1.0 || w["partitions_now"] != 8.0 || w["example_key"] != "a1" ||
		w["key_partition_before"] != "0" || w["key_partition_now"] == nil {
		t.Errorf("the warning: %v", w)
	}
}

// TestCreationLimitSlides: the limit counts the creations of the last hour; a refund gives one back.
func TestCreationLimitSlides(t *testing.T) {
	l := NewCreationLimit(2)
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	if !l.take(t0) || !l.take(t0.Add(time.Minute)) || l.take(t0.Add(2*time.Minute)) {
		t.Fatal("two creations fit, a third in the same hour does not")
	}
	l.refund()
	if !l.take(t0.Add(3*time.Minute)) || l.take(t0.Add(4*time.Minute)) {
		t.Fatal("a refunded creation is available again, once")
	}
	if !l.take(t0.Add(time.Hour)) || l.take(t0.Add(time.Hour+time.Second)) {
		t.Fatal("an hour after the first creation one more fits, not two")
	}
	if NewCreationLimit(0) != nil || !NewCreationLimit(0).take(t0) {
		t.Fatal("0 is no limit")
	}
}

// TestTopicsCreatedPerHourAreBounded: with kafka.max_new_topics_per_hour 2, rows for four made-up
// event types create two topics; the rows for the other two are dead-lettered with a reason naming
// the key (never a replay), and a row for a topic that exists still goes to it.
func TestTopicsCreatedPerHourAreBounded(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := testRouter(t, c, func(o *Options) {
		o.DLQTopic = "dlq"
		o.Kafka.CreateTopics = true
		o.Kafka.MaxNewTopicsPerHour = 2
		o.TopicCreations = NewCreationLimit(2)
	})
	acked := make(chan struct{}, 10)
	for i, typ := range []string{"MadeUp1", "MadeUp2", "MadeUp3", "MadeUp4", "MadeUp1"} {
		if err := send(t, r, row(typ, "e"+string(rune('0'+i))), func() { acked <- struct{}{} }); err != nil {
			t.Fatalf("row %d (%s): %v", i, typ, err)
		}
	}
	for range 5 {
		select {
		case <-acked:
		case <-time.After(10 * time.Second):
			t.Fatalf("not every row was acknowledged: %v", r.Err())
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("dlq", "MadeUp1", "MadeUp2", "MadeUp3", "MadeUp4"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	per := map[string]int{}
	var reasons []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for n := 0; n < 5 && ctx.Err() == nil; {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			n++
			per[rec.Topic]++
			if rec.Topic == "dlq" {
				reasons = append(reasons, header(rec, "outbox.dlq.reason"))
			}
		})
	}
	if per["MadeUp1"] != 2 || per["MadeUp2"] != 1 || per["dlq"] != 2 || per["MadeUp3"]+per["MadeUp4"] != 0 {
		t.Fatalf("records per topic %v: want MadeUp1 2, MadeUp2 1, two dead-lettered", per)
	}
	for _, why := range reasons {
		if !strings.Contains(why, "kafka.max_new_topics_per_hour (2)") {
			t.Errorf("dead-letter reason %q does not name the limit", why)
		}
	}
}
