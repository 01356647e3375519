// The exactly-once checkpoint topic: reading a slot's last checkpoint (read_committed, to the end),
// an at-least-once router's hand-over checkpoint, and the topic's set-up.

package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadCheckpoint reads the checkpoint topic to its end with read_committed isolation and returns the
// slot's last checkpoint, or nil when none was ever committed.
func (r *Router) ReadCheckpoint(ctx context.Context) (*checkpoint.Record, error) {
	return ReadCheckpoint(ctx, r.opts.Kafka, r.opts.Transactions.Topic, r.opts.Transactions.Slot, r.log)
}

// WriteHandover writes rec, an at-least-once router's hand-over checkpoint, to the checkpoint topic in
// a Kafka transaction of the slot's transactional id (the checkpoint reader takes nothing else), so
// that the exactly-once mode resumes at its position without a gap. The topic must exist; no
// exactly-once router of the slot may be running (the slot's exclusivity sees to it: the at-least-once
// router held the slot until now).
func WriteHandover(ctx context.Context, k config.Kafka, topic string, rec checkpoint.Record, log *slog.Logger) error {
	opts, err := ClientOpts(k)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.ClientID(k.ClientID), kgo.WithLogger(kgoLogger{log}),
		kgo.TransactionalID(rec.Slot.TransactionalID()), kgo.TransactionTimeout(k.TransactionTimeout))...)
	if err != nil {
		return fmt.Errorf("create checkpoint writer: %w", err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("write the hand-over checkpoint to %s: %w", topic, err)
	}
	perr := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(rec.Slot.String()), Value: rec.Marshal()}).FirstErr()
	commit := kgo.TryCommit
	if perr != nil {
		commit = kgo.TryAbort
	}
	if err := cl.EndTransaction(ctx, commit); err != nil || perr != nil {
		return fmt.Errorf("write the hand-over checkpoint to %s: %w", topic, errors.Join(perr, err))
	}
	return nil
}

// ReadCheckpoint reads topic to its end with read_committed isolation and returns slot's last
// checkpoint, or nil when none was ever committed (or the topic does not exist). Malformed records
// are logged and skipped.
func ReadCheckpoint(ctx context.Context, k config.Kafka, topic string, slot checkpoint.SlotID, log *slog.Logger) (*checkpoint.Record, error) {
	opts, err := ClientOpts(k)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	consumer, err := kgo.NewClient(append(opts,
		kgo.ClientID(k.ClientID),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Every transaction ends with a control record, kept so that the end is seen even when the
		// log ends with an aborted transaction.
		kgo.KeepControlRecords(),
		kgo.WithLogger(kgoLogger{log}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("create checkpoint reader: %w", err)
	}
	defer consumer.Close()
	admin := kadm.NewClient(consumer)
	ends, err := admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list the end offsets of checkpoint topic %s: %w", topic, err)
	}
	starts, err := admin.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list the start offsets of checkpoint topic %s: %w", topic, err)
	}
	want := make(map[int32]int64) // partition -> last offset to read
	from := make(map[int32]kgo.Offset)
	var lerr error
	ends.Each(func(o kadm.ListedOffset) {
		switch {
		case errors.Is(o.Err, kerr.UnknownTopicOrPartition):
		case o.Err != nil:
			lerr = errors.Join(lerr, fmt.Errorf("checkpoint topic %s partition %d: %w", topic, o.Partition, o.Err))
		default:
			if s, ok := starts.Lookup(topic, o.Partition); !ok || o.Offset > s.Offset {
				want[o.Partition] = o.Offset - 1
				from[o.Partition] = kgo.NewOffset().AtStart()
			}
		}
	})
	if lerr != nil {
		return nil, lerr
	}
	if len(want) == 0 {
		return nil, nil
	}
	consumer.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: from})
	key := slot.String()
	newest := map[int32]*checkpoint.Record{} // per partition, the last record for the slot
	for len(want) > 0 {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read checkpoint topic %s to its end: %w", topic, err)
		}
		var ferr error
		fetches.EachError(func(_ string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err))
		})
		if ferr != nil {
			return nil, fmt.Errorf("read checkpoint topic %s: %w", topic, ferr)
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			if end, ok := want[rec.Partition]; ok && rec.Offset >= end {
				delete(want, rec.Partition)
			}
			if rec.Attrs.IsControl() || string(rec.Key) != key {
				return
			}
			if !rec.Attrs.IsTransactional() {
				// Routers write checkpoints only in committed Kafka transactions: anything else keyed
				// like the slot was put there by something else.
				log.Warn("ignoring a record keyed like this slot's checkpoint that no Kafka transaction wrote", "topic", topic, "partition", rec.Partition, "offset", rec.Offset)
				return
			}
			cp, err := checkpoint.ParseRecord(rec.Key, rec.Value)
			if err != nil {
				log.Warn("ignoring a malformed checkpoint record", "topic", topic, "partition", rec.Partition, "offset", rec.Offset, "error", err.Error())
				return
			}
			newest[rec.Partition] = &cp
		})
	}
	// One partition holds a slot's records unless partitions were added to the topic: then the key's
	// records moved to another one, and the newest is the one written last.
	var last *checkpoint.Record
	for _, cp := range newest {
		if last == nil || cp.Written.After(last.Written) {
			last = cp
		}
	}
	if len(newest) > 1 {
		log.Warn("this slot's checkpoints are in more than one partition of the checkpoint topic (partitions were added to it): using the one written last",
			"topic", topic, "partitions", len(newest), "checkpoint_lsn", last.LSN.String())
	}
	return last, nil
}

// prepareCheckpointTopic creates the checkpoint topic (one partition, compacted) when it is missing,
// and warns when an existing one is not compacted: its size would then grow without bound.
func (r *Router) prepareCheckpointTopic(ctx context.Context) error {
	topic := r.opts.Transactions.Topic
	compact := "compact"
	var denied error
	_, err := r.admin.CreateTopic(ctx, 1, r.opts.Kafka.TopicReplicationFactor, map[string]*string{"cleanup.policy": &compact}, topic)
	switch {
	case err == nil:
		r.log.Info("created checkpoint topic", "topic", topic, "cleanup_policy", compact)
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
	case deniedCreate(err):
		// Kafka checks CREATE before existence: a checkpoint topic created beforehand is used.
		denied = err
	case errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.PolicyViolation), errors.Is(err, kerr.InvalidConfig):
		return fmt.Errorf("%w: create checkpoint topic %s (kafka.checkpoint_topic): %w", ErrConfig, topic, CreateTopicHint(err, r.opts.Kafka))
	default:
		return fmt.Errorf("create checkpoint topic %s (kafka.checkpoint_topic): %w", topic, CreateTopicHint(err, r.opts.Kafka))
	}
	details, err := r.admin.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("look up checkpoint topic %s: %w", topic, err)
	}
	if d, ok := details[topic]; denied != nil && (!ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition)) {
		return fmt.Errorf("%w: checkpoint topic %s (kafka.checkpoint_topic) does not exist and Kafka refuses this principal the right to create it: create it (one partition, cleanup.policy=compact), or grant CREATE: %w",
			ErrConfig, topic, denied)
	}
	if d, ok := details[topic]; ok && d.Err == nil && len(d.Partitions) > 1 {
		r.log.Warn("the checkpoint topic has more than one partition: a slot's checkpoints move to another partition when partitions are added, and the router then takes the one written last (create it with one partition)",
			"topic", topic, "partitions", len(d.Partitions))
	}
	configs, err := r.admin.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return fmt.Errorf("read the configuration of checkpoint topic %s: %w", topic, err)
	}
	rc, err := configs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return fmt.Errorf("read the configuration of checkpoint topic %s: %w", topic, errors.Join(err, rc.Err))
	}
	policy, retention := "delete", "" // Kafka's defaults
	for _, c := range rc.Configs {
		switch {
		case c.Key == "cleanup.policy" && c.Value != nil:
			policy = *c.Value
		case c.Key == "retention.ms" && c.Value != nil:
			retention = *c.Value
		}
	}
	policies := strings.Split(strings.ReplaceAll(policy, " ", ""), ",")
	if !slices.Contains(policies, compact) {
		r.log.Warn("the checkpoint topic is not compacted: it grows by one record per Kafka transaction (set cleanup.policy=compact)",
			"topic", topic, "cleanup_policy", policy)
	}
	if slices.Contains(policies, "delete") && retention != "-1" {
		r.log.Warn("the checkpoint topic deletes records after retention.ms: a slot idle that long loses its checkpoint, and the router then refuses to start until resync (set cleanup.policy=compact alone, or retention.ms=-1)",
			"topic", topic, "cleanup_policy", policy, "retention_ms", retention)
	}
	return nil
}
