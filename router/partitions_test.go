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
