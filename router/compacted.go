// The project's state topics — the checkpoint topic (exactly-once) and the fleet's coordination
// topics — are compacted topics of one partition that a reader must read to their end before it may
// act. This file is the one way to create and describe them and to read them to their end; the data
// and dead-letter topics are the topic cache's (topics.go).

package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// CleanupCompact is the cleanup policy of the state topics: the latest record of every key is kept
// for ever.
const CleanupCompact = "compact"

// CompactedTopic is what EnsureCompactedTopic found or made.
type CompactedTopic struct {
	// ID is the topic's id (zero when it is not known: the topic is missing and could not be made).
	ID kadm.TopicID
	// Created says whether the topic was made now.
	Created bool
	// Missing says that the topic does not exist: Kafka refused to create it (Denied).
	Missing bool
	// Denied is Kafka's refusal to let this principal create topics (nil when it may, or was not
	// asked because the topic existed). Kafka checks CREATE before existence, so an existing topic
	// may come with Denied set: it is used.
	Denied error
	// Partitions is the number of partitions of an existing topic (1 when made now).
	Partitions int
	// Policy and Retention are its cleanup.policy and retention.ms ("" where Kafka's default
	// applies: delete, 7 days).
	Policy, Retention string
}

// Compacted reports whether the topic's cleanup policy keeps the latest record of each key.
func (t CompactedTopic) Compacted() bool { return policyHas(t.Policy, CleanupCompact) }

// Deletes reports whether the topic deletes records after a retention (cleanup.policy delete, the
// default, with retention.ms other than -1).
func (t CompactedTopic) Deletes() bool {
	return (t.Policy == "" || policyHas(t.Policy, "delete")) && t.Retention != "-1"
}

// policyHas reports whether the comma list policy holds p.
func policyHas(policy, p string) bool {
	for _, s := range strings.Split(policy, ",") {
		if strings.TrimSpace(s) == p {
			return true
		}
	}
	return false
}

// EnsureCompactedTopic creates topic with one partition and cleanup.policy=compact when it is
// missing, and describes it: its id, partitions and cleanup settings. What an existing topic's
// settings mean is the caller's to judge (TopicPolicy reads them again later). Errors are wrapped
// with CreateTopicHint's advice where Kafka refused the creation for a reason other than existence or
// CREATE.
func EnsureCompactedTopic(ctx context.Context, adm *kadm.Client, topic string, replicationFactor int16) (CompactedTopic, error) {
	var t CompactedTopic
	res, err := adm.CreateTopic(ctx, 1, replicationFactor, map[string]*string{"cleanup.policy": kadm.StringPtr(CleanupCompact)}, topic)
	if err == nil {
		err = res.Err
	}
	switch {
	case err == nil:
		return CompactedTopic{ID: res.ID, Created: true, Partitions: 1, Policy: CleanupCompact}, nil
	case errors.Is(err, kerr.TopicAlreadyExists):
	case deniedCreate(err):
		t.Denied = err
	default:
		return t, fmt.Errorf("create topic %s: %w", topic, err)
	}
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return t, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	d, ok := details[topic]
	switch {
	case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		t.Missing = true
		return t, nil
	case d.Err != nil:
		return t, fmt.Errorf("describe topic %s: %w", topic, d.Err)
	}
	t.ID, t.Partitions = d.ID, len(d.Partitions)
	t.Policy, t.Retention, err = TopicPolicy(ctx, adm, topic)
	return t, err
}

// TopicPolicy returns topic's cleanup.policy and retention.ms ("" where Kafka's default applies). An
// error wraps kerr.UnknownTopicOrPartition when the topic does not exist.
func TopicPolicy(ctx context.Context, adm *kadm.Client, topic string) (policy, retention string, err error) {
	configs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return "", "", fmt.Errorf("describe the configuration of %s: %w", topic, err)
	}
	rc, err := configs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return "", "", fmt.Errorf("describe the configuration of %s: %w", topic, err)
	}
	for _, c := range rc.Configs {
		switch {
		case c.Key == "cleanup.policy" && c.Value != nil:
			policy = strings.ReplaceAll(*c.Value, " ", "")
		case c.Key == "retention.ms" && c.Value != nil:
			retention = *c.Value
		}
	}
	return policy, retention, nil
}

// ToRead lists, per partition of topic holding records, the end offset a reader must reach: the end
// offsets of the moment, less the partitions whose records are all gone (the log start at the end).
// A topic that does not exist has nothing to read.
func ToRead(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list the end offsets of %s: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list the start offsets of %s: %w", topic, err)
	}
	need := map[int32]int64{}
	var lerr error
	ends.Each(func(o kadm.ListedOffset) {
		switch {
		case errors.Is(o.Err, kerr.UnknownTopicOrPartition):
		case o.Err != nil:
			lerr = errors.Join(lerr, fmt.Errorf("%s partition %d: %w", topic, o.Partition, o.Err))
		default:
			if s, ok := starts.Lookup(topic, o.Partition); o.Offset > 0 && (!ok || s.Err != nil || s.Offset < o.Offset) {
				need[o.Partition] = o.Offset
			}
		}
	})
	return need, lerr
}

// ReadOptions say what ReadToEnd does beside applying records.
type ReadOptions struct {
	// FetchError is given each fetch error; a non-nil return ends the reading with it. Nil: fetch
	// errors are retried (a second apart).
	FetchError func(partition int32, err error) error
	// Gone is told of a partition whose records still to read were deleted before they were read
	// (its log start passed them: a retention, DeleteRecords); the partition then counts as read.
	Gone func(partition int32, logStart int64)
	// Idle is how long a poll that brings nothing waits before the log starts are checked (2 s when
	// zero).
	Idle time.Duration
}

// ReadToEnd applies the records cl fetches from topic until every partition of need (ToRead) has been
// read to its end offset, or its records still to read are gone, or ctx ends (its error). cl must
// consume topic from the start of its log; it may go on consuming afterwards.
func ReadToEnd(ctx context.Context, cl *kgo.Client, topic string, need map[int32]int64, apply func(*kgo.Record), o ReadOptions) error {
	if o.Idle <= 0 {
		o.Idle = 2 * time.Second
	}
	adm := kadm.NewClient(cl)
	for len(need) > 0 {
		pctx, cancel := context.WithTimeout(ctx, o.Idle)
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s to its end: %w", topic, err)
		}
		var ferr error
		failed := false
		fetches.EachError(func(t string, p int32, err error) {
			if t != topic || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			failed = true
			if o.FetchError != nil {
				ferr = errors.Join(ferr, o.FetchError(p, err))
			}
		})
		if ferr != nil {
			return fmt.Errorf("read %s: %w", topic, ferr)
		}
		got := 0
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Topic != topic {
				return
			}
			got++
			if end, ok := need[r.Partition]; ok && r.Offset+1 >= end {
				delete(need, r.Partition)
			}
			apply(r)
		})
		if got > 0 {
			continue
		}
		if failed {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		// Nothing came: the records still needed may be gone.
		actx, acancel := context.WithTimeout(ctx, 15*time.Second)
		starts, err := adm.ListStartOffsets(actx, topic)
		acancel()
		if err != nil {
			continue
		}
		for p, end := range need {
			if s, ok := starts.Lookup(topic, p); ok && s.Err == nil && s.Offset >= end {
				delete(need, p)
				if o.Gone != nil {
					o.Gone(p, s.Offset)
				}
			}
		}
	}
	return nil
}
