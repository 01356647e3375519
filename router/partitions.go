package router

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// defaultPartitionCheckInterval is Options.PartitionCheckInterval's default.
const defaultPartitionCheckInterval = 30 * time.Second

// watchPartitions reads the partition counts of the topics the router uses, every
// Options.PartitionCheckInterval until ctx ends, and warns once per topic that gained partitions:
// keys then map to other partitions, and Kafka keeps no order between a key's events on its old
// partition and those on its new one. The producer itself learns of the new partitions only when its
// metadata is refreshed, which may be minutes later.
func (r *Router) watchPartitions(ctx context.Context) {
	every := r.opts.PartitionCheckInterval
	if every <= 0 {
		every = defaultPartitionCheckInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var names []string
		r.topics.Range(func(k, v any) bool {
			if info := v.(topicInfo); info.partitions > 0 && info.grew != nil && !info.grew.Load() {
				names = append(names, k.(string))
			}
			return true
		})
		if len(names) == 0 {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		details, err := r.admin.ListTopics(lctx, names...)
		cancel()
		if err != nil {
			continue // asked again at the next tick
		}
		for _, name := range names {
			d, ok := details[name]
			v, known := r.topics.Load(name)
			if !ok || d.Err != nil || !known {
				continue
			}
			if info := v.(topicInfo); int32(len(d.Partitions)) > info.partitions {
				r.warnGrown(name, info, int32(len(d.Partitions)))
			}
		}
	}
}

// warnGrown warns, once per topic, that topic has now partitions partitions where it had
// info.partitions when the router first used it, with where the last key produced to it went before
// and goes now.
func (r *Router) warnGrown(topic string, info topicInfo, partitions int32) {
	if !info.grew.CompareAndSwap(false, true) {
		return
	}
	attrs := []any{"topic", topic, "partitions_before", info.partitions, "partitions_now", partitions}
	if k := info.lastKey.Load(); k != nil {
		// The producer's partitioner (murmur2 of the key, as Java's): where the key went, and goes.
		part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
		rec := &kgo.Record{Key: *k}
		attrs = append(attrs, "example_key", truncate(string(*k), 64),
			"key_partition_before", strconv.Itoa(part.Partition(rec, int(info.partitions))),
			"key_partition_now", strconv.Itoa(part.Partition(rec, int(partitions))))
	}
	r.log.Warn("topic gained partitions while streaming: keys now map to other partitions, so a consumer may see a key's new events before its older ones still unread on its old partition; add partitions only to topics whose consumers do not rely on per-key order, or while nothing is unread",
		attrs...)
}

// checkPartitions notes the record's key for the topic, and warns, once per topic, when the record
// went to a partition the topic did not have when the router first used it (watchPartitions notices
// the growth sooner: the producer learns of new partitions only with its metadata).
func (r *Router) checkPartitions(rec *kgo.Record) {
	v, ok := r.topics.Load(rec.Topic)
	if !ok {
		return
	}
	info := v.(topicInfo)
	if len(rec.Key) > 0 && info.lastKey != nil {
		info.lastKey.Store(&rec.Key)
	}
	if info.partitions > 0 && rec.Partition >= info.partitions {
		r.warnGrown(rec.Topic, info, rec.Partition+1)
	}
}
