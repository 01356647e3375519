// Dead letters: a row that can never be delivered goes to routing.dlq_topic with its reason in
// headers (bounded), or, without a dead-letter topic, stops the router naming it.

package router

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/outbox"
	"github.com/twmb/franz-go/pkg/kgo"
)

// maxReasonBytes bounds the reason header of a dead-letter record, and the reason logged; maxLoggedID
// bounds the event id logged (a column may hold anything, one log line stays a line).
const (
	maxReasonBytes = 2048
	maxLoggedID    = 256
)

// produceDLQ writes the dead-letter record for orig (p's record, or what Kafka returned of it); the
// room p holds is released when the dead-letter record is acknowledged. It never blocks, so it may
// run on the promise goroutine.
func (r *Router) produceDLQ(orig *kgo.Record, p *Prepared, reason, class string, ack func()) {
	typ, src := p.typ, p.src
	if r.opts.DLQTopic == "" {
		r.release(p.reserved())
		r.fail(&UndeliverableError{EventID: eventID(orig), Reason: reason, CommitLSN: src.CommitLSN})
		return
	}
	dlq := &kgo.Record{Topic: r.opts.DLQTopic, Key: orig.Key, Value: orig.Value}
	for _, h := range orig.Headers {
		if !strings.HasPrefix(h.Key, outbox.DLQHeaderPrefix) {
			dlq.Headers = append(dlq.Headers, h)
		}
	}
	own := []kgo.RecordHeader{
		{Key: outbox.HeaderDLQReason, Value: []byte(truncate(reason, maxReasonBytes))},
		{Key: outbox.HeaderDLQSourceLSN, Value: []byte(src.Position())},
		{Key: outbox.HeaderDLQTime, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	}
	if orig.Topic != "" {
		own = append(own, kgo.RecordHeader{Key: outbox.HeaderDLQTopic, Value: []byte(orig.Topic)})
	}
	limit := r.opts.Kafka.MaxMessageBytes
	if v, ok := r.topics.Load(r.opts.DLQTopic); ok && v.(topicInfo).limit > 0 {
		limit = v.(topicInfo).limit
	}
	fitDLQ(dlq, own, int(limit))
	r.log.Warn("dead-lettering event", "event_id", truncate(eventID(orig), maxLoggedID), "reason", truncate(reason, maxReasonBytes), "dlq_topic", r.opts.DLQTopic, "source_lsn", src.Position())
	client, _ := r.producer()
	client.Produce(context.Background(), dlq, func(_ *kgo.Record, err error) {
		r.release(p.reserved())
		if err != nil {
			r.fail(fmt.Errorf("write event %s to dead-letter topic %s: %w", eventID(orig), r.opts.DLQTopic, err))
			return
		}
		r.opts.Counters.DeadLettered.Add(1)
		if r.opts.Observer != nil {
			r.opts.Observer.DeadLettered(typ, class)
		}
		ack()
	})
}

// dlqMarkerRoom is what the truncation marker headers may take.
const dlqMarkerRoom = 8*(headerOverhead+40) + 64

// fitDLQ makes the dead-letter record fit in limit bytes whatever the row held: it appends the
// dead-letter headers own, then cuts what is largest first — the value (truncated) or the row's own
// headers (dropped) — then the key, marking each cut with the original size. The event's identity and
// attributes (event_id, ce_id, ce_type, ce_source, ...) are kept: a consumer of the dead-letter topic
// must be able to tell which event it was. What is kept is copied, so that the row's large buffers
// are not kept alive by a prefix.
func fitDLQ(dlq *kgo.Record, own []kgo.RecordHeader, limit int) {
	dlq.Headers = append(dlq.Headers, own...)
	if recordSize(dlq) <= limit {
		return
	}
	budget := limit - dlqMarkerRoom
	var marks []kgo.RecordHeader
	mark := func(k, v string) { marks = append(marks, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	rowHeaders := dlq.Headers[:len(dlq.Headers)-len(own)]
	var identity, extras []kgo.RecordHeader
	extraBytes := 0
	for _, h := range rowHeaders {
		if isOutboxHeader(h.Key) || isCloudEventsHeader(h.Key) {
			identity = append(identity, h)
		} else {
			extras = append(extras, h)
			extraBytes += headerOverhead + len(h.Key) + len(h.Value)
		}
	}
	cutValue := func() {
		if over := recordSize(dlq) - budget; over > 0 && len(dlq.Value) > 0 {
			keep := max(len(dlq.Value)-over, 0)
			mark(outbox.HeaderDLQTruncated, "true")
			mark(outbox.HeaderDLQOriginalBytes, strconv.Itoa(len(dlq.Value)))
			dlq.Value = bytes.Clone(dlq.Value[:keep])
		}
	}
	dropExtras := func() {
		if recordSize(dlq) > budget && len(extras) > 0 {
			mark(outbox.HeaderDLQHeadersDropped, strconv.Itoa(len(extras)))
			mark(outbox.HeaderDLQOriginalHeaderSize, strconv.Itoa(extraBytes))
			dlq.Headers = append(slices.Clone(identity), own...)
			extras = nil
		}
	}
	// The larger of the two goes first: a huge headers column must not cost an innocent value.
	if extraBytes > len(dlq.Value) {
		dropExtras()
		cutValue()
	} else {
		cutValue()
		dropExtras()
	}
	if over := recordSize(dlq) - budget; over > 0 && len(dlq.Key) > 0 {
		keep := max(len(dlq.Key)-over, 0)
		mark(outbox.HeaderDLQKeyTruncated, "true")
		mark(outbox.HeaderDLQOriginalKeyBytes, strconv.Itoa(len(dlq.Key)))
		dlq.Key = bytes.Clone(dlq.Key[:keep])
	}
	if recordSize(dlq) > budget && len(identity) > 0 {
		// Only attributes of absurd size are left: the dead-letter headers say why.
		mark(outbox.HeaderDLQHeadersDropped, strconv.Itoa(len(identity)+len(extras)))
		dlq.Headers = slices.Clone(own)
	}
	dlq.Headers = append(dlq.Headers, marks...)
}
