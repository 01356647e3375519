package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

var reservedHeaders = map[string]bool{
	outbox.HeaderEventID: true, outbox.HeaderEventType: true, outbox.HeaderAggregateType: true, outbox.HeaderAggregateVersion: true, outbox.HeaderCreatedAt: true,
}

// buildRecord makes the record for row without its topic: key = aggregate_id, value = payload bytes
// as stored, headers from the row's columns and every key of its headers JSON object. A row that can
// never be a valid record returns an *undeliverable error; the record returned with it still carries
// what could be read, for the dead-letter topic.
func buildRecord(row Row, cols config.Columns) (*kgo.Record, error) {
	rec := &kgo.Record{Headers: make([]kgo.RecordHeader, 0, 5)}
	var problem error
	if id, ok := row.Value(cols.AggregateID); ok && len(id) > 0 {
		rec.Key = id
	} else {
		problem = &undeliverable{reason: fmt.Sprintf("column %s (aggregate id, the Kafka key) is NULL or empty", cols.AggregateID)}
	}
	if id, ok := row.Value(cols.EventID); (!ok || len(id) == 0) && problem == nil {
		problem = &undeliverable{reason: fmt.Sprintf("column %s (event id, which consumers deduplicate on) is NULL or empty", cols.EventID)}
	}
	if v, ok := row.Value(cols.Payload); ok {
		rec.Value = v
	}
	add := func(key, column string) {
		if column == "" {
			return
		}
		if v, ok := row.Value(column); ok {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: key, Value: v})
		}
	}
	add(outbox.HeaderEventID, cols.EventID)
	add(outbox.HeaderEventType, cols.EventType)
	add(outbox.HeaderAggregateType, cols.AggregateType)
	add(outbox.HeaderAggregateVersion, cols.AggregateVersion)
	add(outbox.HeaderCreatedAt, cols.CreatedAt)
	if cols.Headers != "" {
		if raw, ok := row.Value(cols.Headers); ok && len(bytes.TrimSpace(raw)) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			extra, err := jsonHeaders(raw)
			if err != nil && problem == nil {
				problem = &undeliverable{reason: fmt.Sprintf("column %s: %v", cols.Headers, err)}
			}
			rec.Headers = append(rec.Headers, extra...)
		}
	}
	return rec, problem
}

// jsonHeaders turns a JSON object into headers in key order: string values as they are, other
// values as their JSON text. Keys that collide with the record's own headers are left out.
func jsonHeaders(raw []byte) ([]kgo.RecordHeader, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("headers must be a JSON object: %v", err)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		if !reservedHeaders[k] && !strings.HasPrefix(k, outbox.DLQHeaderPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]kgo.RecordHeader, 0, len(keys))
	for _, k := range keys {
		v := obj[k]
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			out = append(out, kgo.RecordHeader{Key: k, Value: []byte(s)})
			continue
		}
		if string(v) == "null" {
			out = append(out, kgo.RecordHeader{Key: k})
			continue
		}
		out = append(out, kgo.RecordHeader{Key: k, Value: append([]byte(nil), v...)})
	}
	return out, nil
}

// Kafka's record batch format (v2): a batch header of 61 bytes, then per record a length, attributes,
// timestamp and offset deltas, key and value lengths and a header count, all varints (at most 36 bytes
// together), and per header two varint lengths (at most 10 bytes). Brokers check max.message.bytes
// against the whole batch, uncompressed here as Kafka's Java producer does.
const (
	batchOverhead  = 61 + 36
	headerOverhead = 10
)

// recordSize is the size of a batch that holds only r: what the broker compares with
// max.message.bytes. It never underestimates.
func recordSize(r *kgo.Record) int {
	n := batchOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += headerOverhead + len(h.Key) + len(h.Value)
	}
	return n
}

// header returns the value of the first header named key.
func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
