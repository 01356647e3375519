package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestCompactedTopicsReadToTheirEnd, on the real broker: EnsureCompactedTopic makes a compacted topic
// of one partition once and describes it after; ReadToEnd reads what ToRead listed, and returns
// (telling Gone) when the records still to read are deleted before it reads them — the checkpoint
// reader and the fleet's state reader share it, so neither waits for records that no longer exist.
// (Checked by breaking it: without the log-start check, the last case runs into its deadline.)
func TestCompactedTopicsReadToTheirEnd(t *testing.T) {
	brokers := testenv.Brokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := fmt.Sprintf("compacted-%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })

	made, err := EnsureCompactedTopic(ctx, adm, topic, 1)
	if err != nil || !made.Created || !made.Compacted() || made.Deletes() {
		t.Fatalf("first EnsureCompactedTopic: %+v, %v", made, err)
	}
	again, err := EnsureCompactedTopic(ctx, adm, topic, 1)
	if err != nil || again.Created || again.ID != made.ID || again.Partitions != 1 || !again.Compacted() || again.Deletes() {
		t.Fatalf("second EnsureCompactedTopic: %+v, %v (made %+v)", again, err, made)
	}
	if need, err := ToRead(ctx, adm, topic); err != nil || len(need) != 0 {
		t.Fatalf("ToRead of an empty topic: %v, %v", need, err)
	}
	for i := range 5 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	read := func(need map[int32]int64) (n int, gone []int64, err error) {
		rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err = ReadToEnd(rctx, rd, topic, need, func(*kgo.Record) { n++ }, ReadOptions{Idle: 500 * time.Millisecond, Gone: func(_ int32, start int64) { gone = append(gone, start) }})
		return n, gone, err
	}
	need, err := ToRead(ctx, adm, topic)
	if err != nil || need[0] != 5 {
		t.Fatalf("ToRead: %v, %v; want partition 0 to offset 5", need, err)
	}
	if n, gone, err := read(need); err != nil || n != 5 || len(gone) != 0 {
		t.Fatalf("ReadToEnd: %d records, gone %v, %v; want 5, none gone", n, gone, err)
	}
	// A topic that deletes (a state topic set to delete by mistake): every record deleted after the
	// listing, nothing is left to wait for.
	topic = fmt.Sprintf("deleting-%d", time.Now().UnixNano())
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })
	for i := range 5 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if need, err = ToRead(ctx, adm, topic); err != nil || need[0] != 5 {
		t.Fatalf("ToRead: %v, %v; want partition 0 to offset 5", need, err)
	}
	deleted, err := adm.DeleteRecords(ctx, kadm.Offsets{topic: {0: {Topic: topic, Partition: 0, At: 5}}})
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	if n, gone, err := read(need); err != nil || n != 0 || len(gone) != 1 || gone[0] != 5 {
		t.Fatalf("ReadToEnd of deleted records: %d records, gone %v, %v; want none read, partition 0 gone at 5", n, gone, err)
	}
	if need, err := ToRead(ctx, adm, topic); err != nil || len(need) != 0 {
		t.Fatalf("ToRead after the deletion: %v, %v; want nothing to read", need, err)
	}
}
