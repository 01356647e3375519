package router

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestTopicCreationRefusalsNameTheSetting: the real broker refuses a topic whose replication factor
// is above its brokers, or whose settings it does not take; the error names the setting that made the
// request, so that an operator reading the log knows what to change. Other refusals get their hint
// too, and an error without one passes unchanged.
func TestTopicCreationRefusalsNameTheSetting(t *testing.T) {
	brokers := testenv.Brokers(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		k    config.Kafka
		want string
	}{
		{"replication factor", config.Kafka{TopicPartitions: 1, TopicReplicationFactor: 3}, "kafka.topic_replication_factor is 3"},
		{"topic setting", config.Kafka{TopicPartitions: 1, TopicReplicationFactor: 1, TopicConfig: map[string]string{"cleanup.policy": "sometimes"}}, "kafka.topic_config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.k.Brokers, tc.k.ClientID = brokers, "test"
			a, err := NewAdmin(tc.k)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			_, err = a.CreateTopics(ctx, "refused-"+suffix)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{kerr.PolicyViolation, "create.topic.policy"},
		{kerr.TopicAuthorizationFailed, "kafka.create_topics: false"},
		{kerr.ClusterAuthorizationFailed, "grant it CREATE"},
		{kerr.InvalidPartitions, "kafka.topic_partitions is 0"},
		{kerr.BrokerNotAvailable, ""},
	} {
		got := CreateTopicHint(fmt.Errorf("create: %w", tc.err), config.Kafka{})
		if !strings.Contains(got.Error(), tc.want) || (tc.want == "" && got.Error() != "create: "+tc.err.Error()) {
			t.Errorf("%v: got %q, want it to name %q", tc.err, got, tc.want)
		}
	}
}
