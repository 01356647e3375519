package router

import (
	"context"
	"strconv"
	"sync"
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

// CreationLimit bounds the topics a router creates per hour (kafka.max_new_topics_per_hour): a
// column that routes to a topic per value, with values no one planned (a made-up event type per
// row), would otherwise create topics without end. It outlives the routers of a pipeline's sessions.
// Safe for concurrent use; a nil *CreationLimit is no limit.
type CreationLimit struct {
	mu    sync.Mutex
	max   int
	times []time.Time // the creations of the last hour, oldest first
}

// NewCreationLimit returns a limit of max topics per hour; max 0 is no limit (nil).
func NewCreationLimit(max int) *CreationLimit {
	if max <= 0 {
		return nil
	}
	return &CreationLimit{max: max}
}

// take counts one creation now, or reports false when the hour's creations are used up.
func (l *CreationLimit) take(now time.Time) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for i < len(l.times) && now.Sub(l.times[i]) >= time.Hour {
		i++
	}
	l.times = l.times[i:]
	if len(l.times) >= l.max {
		return false
	}
	l.times = append(l.times, now)
	return true
}

// refund gives back the last creation taken (the topic existed after all).
func (l *CreationLimit) refund() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.times); n > 0 {
		l.times = l.times[:n-1]
	}
}
