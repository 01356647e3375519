package router

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// Admin is the Kafka administration the operator commands need — which topics exist, creating
// them — on the same connection settings as the router. It is not safe for concurrent use.
type Admin struct {
	k   config.Kafka
	cl  *kgo.Client
	adm *kadm.Client
}

// NewAdmin returns an admin client for k's brokers. It does not contact Kafka.
func NewAdmin(k config.Kafka) (*Admin, error) {
	opts, err := ClientOpts(k)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.ClientID(k.ClientID))...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	return &Admin{k: k, cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the client.
func (a *Admin) Close() { a.cl.Close() }

// Topics reports which of names exist (present) and which do not (missing), in the order given.
func (a *Admin) Topics(ctx context.Context, names ...string) (present, missing []string, err error) {
	all, err := a.adm.ListTopics(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list topics on %v: %w", a.k.Brokers, err)
	}
	for _, t := range names {
		if all.Has(t) {
			present = append(present, t)
		} else {
			missing = append(missing, t)
		}
	}
	return present, missing, nil
}

// CreateTopics creates those of names that do not exist, with kafka.topic_partitions,
// kafka.topic_replication_factor and kafka.topic_config, and returns the ones it created; existing
// topics are left alone.
func (a *Admin) CreateTopics(ctx context.Context, names ...string) (created []string, err error) {
	resp, err := a.adm.CreateTopics(ctx, a.k.TopicPartitions, a.k.TopicReplicationFactor, TopicConfigs(a.k), names...)
	if err != nil {
		return nil, fmt.Errorf("create topics on %v: %w", a.k.Brokers, err)
	}
	for _, t := range names {
		switch r := resp[t]; {
		case r.Err == nil:
			created = append(created, t)
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
		default:
			return created, fmt.Errorf("create topic %s: %w", t, CreateTopicHint(r.Err, a.k))
		}
	}
	return slices.Clip(created), nil
}

// CreateTopicHint adds to Kafka's refusal to create a topic the setting that made it, or what to do
// instead: the replication factor above the brokers available, a partition count or topic setting
// the broker refuses, a creation policy, or a principal that may not create topics.
func CreateTopicHint(err error, k config.Kafka) error {
	switch {
	case errors.Is(err, kerr.InvalidReplicationFactor):
		return fmt.Errorf("%w (kafka.topic_replication_factor is %d: at most the brokers available; lower it, or create the topic yourself)", err, k.TopicReplicationFactor)
	case errors.Is(err, kerr.InvalidPartitions):
		return fmt.Errorf("%w (kafka.topic_partitions is %d)", err, k.TopicPartitions)
	case errors.Is(err, kerr.InvalidConfig):
		return fmt.Errorf("%w (the broker refused a topic setting: kafka.topic_config, kafka.compression)", err)
	case errors.Is(err, kerr.PolicyViolation):
		return fmt.Errorf("%w (the cluster's create.topic.policy refused it: create the topic yourself, or set kafka.topic_partitions, kafka.topic_replication_factor and kafka.topic_config to what it takes)", err)
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("%w (the principal may not create topics: grant it CREATE, or create the topics yourself and set kafka.create_topics: false)", err)
	}
	return err
}
