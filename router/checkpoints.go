// The exactly-once checkpoint topic: reading a slot's last checkpoint (read_committed, to the end),
// an at-least-once router's hand-over checkpoint, and the topic's set-up.

package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	need, err := ToRead(ctx, kadm.NewClient(consumer), topic)
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic: %w", err)
	}
	if len(need) == 0 {
		return nil, nil
	}
	from := make(map[int32]kgo.Offset, len(need))
	for p := range need {
		from[p] = kgo.NewOffset().AtStart()
	}
	consumer.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: from})
	key := slot.String()
	newest := map[int32]*checkpoint.Record{} // per partition, the last record for the slot
	err = ReadToEnd(ctx, consumer, topic, need, func(rec *kgo.Record) {
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
	}, ReadOptions{
		FetchError: func(p int32, err error) error { return fmt.Errorf("partition %d: %w", p, err) },
		Gone: func(p int32, logStart int64) {
			log.Warn("records of the checkpoint topic were deleted while this router read them (cleanup.policy must be compact alone, or retention.ms=-1)",
				"topic", topic, "partition", p, "log_start", logStart)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic: %w", err)
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
	t, err := EnsureCompactedTopic(ctx, r.admin, topic, r.opts.Kafka.TopicReplicationFactor)
	switch {
	case err == nil:
	case errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.PolicyViolation), errors.Is(err, kerr.InvalidConfig):
		return fmt.Errorf("%w: checkpoint topic %s (kafka.checkpoint_topic): %w", ErrConfig, topic, CreateTopicHint(err, r.opts.Kafka))
	default:
		return fmt.Errorf("checkpoint topic %s (kafka.checkpoint_topic): %w", topic, CreateTopicHint(err, r.opts.Kafka))
	}
	switch {
	case t.Created:
		r.log.Info("created checkpoint topic", "topic", topic, "cleanup_policy", CleanupCompact)
		return nil
	case t.Missing && t.Denied != nil:
		// Kafka checks CREATE before existence: a checkpoint topic created beforehand is used.
		return fmt.Errorf("%w: checkpoint topic %s (kafka.checkpoint_topic) does not exist and Kafka refuses this principal the right to create it: create it (one partition, cleanup.policy=compact), or grant CREATE: %w",
			ErrConfig, topic, t.Denied)
	case t.Missing:
		return fmt.Errorf("checkpoint topic %s (kafka.checkpoint_topic) was reported to exist and then not found: deleted meanwhile?", topic)
	}
	if t.Partitions > 1 {
		r.log.Warn("the checkpoint topic has more than one partition: a slot's checkpoints move to another partition when partitions are added, and the router then takes the one written last (create it with one partition)",
			"topic", topic, "partitions", t.Partitions)
	}
	policy, retention := t.Policy, t.Retention
	if policy == "" {
		policy = "delete" // Kafka's default
	}
	if !t.Compacted() {
		r.log.Warn("the checkpoint topic is not compacted: it grows by one record per Kafka transaction (set cleanup.policy=compact)",
			"topic", topic, "cleanup_policy", policy)
	}
	if t.Deletes() {
		r.log.Warn("the checkpoint topic deletes records after retention.ms: a slot idle that long loses its checkpoint, and the router then refuses to start until resync (set cleanup.policy=compact alone, or retention.ms=-1)",
			"topic", topic, "cleanup_policy", policy, "retention_ms", retention)
	}
	return nil
}
