package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// DebeziumFormat writes what Debezium's outbox EventRouter (3.x, PostgreSQL connector with its
// default type handling) and Kafka Connect's converters write for the same row: the key and value as
// StringConverter or JsonConverter (schemas.enable=false) serialize them, one id header, the
// additional fields as headers (SimpleHeaderConverter), envelope fields or the partition.
type DebeziumFormat struct {
	// JSON is JsonConverter with schemas.enable=false for key and value; otherwise StringConverter.
	JSON bool
	// Fields is table.fields.additional.placement.
	Fields []config.AdditionalField
	// ExpandJSONPayload is table.expand.json.payload.
	ExpandJSONPayload bool
	// TombstoneOnEmptyPayload is route.tombstone.on.empty.payload.
	TombstoneOnEmptyPayload bool
}

// DebeziumHeaderID is the header the EventRouter puts the event id in.
const DebeziumHeaderID = "id"

// PostgreSQL type OIDs whose Debezium representation differs from their text.
const (
	oidBool        = 16
	oidInt2        = 21
	oidInt4        = 23
	oidInt8        = 20
	oidFloat4      = 700
	oidFloat8      = 701
	oidDate        = 1082
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidJSONB       = 3802
)

// messageRow is a Row made from a logical decoding message's content (replication.Row.Message): its
// column types are the JSON kinds of the content's fields.
type messageRow interface {
	Message() bool
}

// connectValue is a column's value as Debezium's PostgreSQL connector gives it to Kafka Connect: its
// kind decides how a converter writes it.
type connectValue struct {
	null bool
	// text is the value's string form (SimpleHeaderConverter's, StringConverter's); number and
	// boolean values are written bare in JSON, the others as JSON strings.
	text    string
	numeric bool
	// expanded, when not nil, is the value as JsonConverter writes it (a Connect struct or array
	// made from JSON); text is then its Java toString, which StringConverter writes.
	expanded []byte
}

// debeziumValue reads a column of row as Debezium's connector represents it: booleans as true/false,
// integers and floating-point numbers as Java prints them, timestamptz as an ISO-8601 UTC string
// (ZonedTimestamp), timestamp as microseconds since the epoch (MicroTimestamp), date as days since
// the epoch (Date), everything else (text, uuid, json, jsonb, ...) as its text.
func debeziumValue(row Row, column string) connectValue {
	v, ok := row.Value(column)
	if !ok {
		return connectValue{null: true}
	}
	var oid uint32
	if tr, ok := row.(typedRow); ok {
		oid, _ = tr.TypeOID(column)
	}
	if m, ok := row.(messageRow); ok && m.Message() && (oid == oidNumeric || oid == oidJSONB) {
		return messageValue(v)
	}
	s := string(v)
	switch oid {
	case oidBool:
		return connectValue{text: strconv.FormatBool(s == "t" || s == "true"), numeric: true}
	case oidInt2, oidInt4, oidInt8:
		return connectValue{text: s, numeric: true}
	case oidFloat4, oidFloat8:
		bits := 64
		if oid == oidFloat4 {
			bits = 32
		}
		if f, err := strconv.ParseFloat(s, bits); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return connectValue{text: javaDouble(f, bits), numeric: true}
		}
		return connectValue{text: s}
	case oidTimestamp:
		if t, ok := parseStamp(v); ok {
			return connectValue{text: strconv.FormatInt(t.UnixMicro(), 10), numeric: true}
		}
	case oidDate:
		if t, err := time.Parse("2006-01-02", s); err == nil {
			return connectValue{text: strconv.FormatInt(t.Unix()/86400, 10), numeric: true}
		}
	case oidTimestamptz:
		// Debezium's ZonedTimestamp: ISO 8601 in UTC with the column's six fractional digits.
		if t, ok := parseStamp(v); ok {
			return connectValue{text: t.UTC().Format("2006-01-02T15:04:05.000000Z")}
		}
	}
	return connectValue{text: s}
}

// messageValue is a JSON number, object or array of a message's content as Debezium's
// DecodeLogicalDecodingMessageContent gives it to Kafka Connect: JsonSchemaData's int32, int64 or
// float64 for a number, a struct for an object (null members and empty arrays left out), an array
// for an array. Where Debezium's inference fails (its connector task would stop: an array mixing
// kinds, an integer beyond 64 bits), the value is written as the JSON it is.
func messageValue(v []byte) connectValue {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	node, err := decodeOrdered(dec)
	if err != nil {
		return connectValue{text: string(v)}
	}
	switch t := node.(type) {
	case json.Number:
		switch numberKind(t) {
		case "int", "long":
			return connectValue{text: t.String(), numeric: true}
		case "double":
			if f, err := strconv.ParseFloat(t.String(), 64); err == nil && !math.IsInf(f, 0) {
				return connectValue{text: javaDouble(f, 64), numeric: true}
			}
		}
		return connectValue{text: t.String(), numeric: true}
	case bool:
		return connectValue{text: strconv.FormatBool(t), numeric: true}
	case string:
		return connectValue{text: t}
	case []member, []any:
		var b bytes.Buffer
		if writeExpanded(&b, node) {
			var text strings.Builder
			connectText(&text, node)
			return connectValue{text: text.String(), expanded: b.Bytes()}
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, v); err != nil {
		return connectValue{text: string(v)}
	}
	return connectValue{text: compact.String(), expanded: compact.Bytes()}
}

// connectText writes what Java's toString gives for the Connect value JsonSchemaData makes of a
// JSON value (one writeExpanded accepts): Struct{name=value,...} for an object, [a, b] for an array,
// strings as they are, numbers as Long or Double print them.
func connectText(b *strings.Builder, v any) {
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case string:
		b.WriteString(t)
	case json.Number:
		if numberKind(t) == "double" {
			f, _ := strconv.ParseFloat(t.String(), 64)
			b.WriteString(javaDouble(f, 64))
		} else {
			b.WriteString(t.String())
		}
	case []member:
		b.WriteString("Struct{")
		for i, m := range objectMembers(t) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(m.name + "=")
			connectText(b, m.value)
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteString(", ")
			}
			connectText(b, e)
		}
		b.WriteByte(']')
	}
}

// json appends v as JsonConverter writes it.
func (v connectValue) json(b []byte) []byte {
	switch {
	case v.expanded != nil:
		return append(b, v.expanded...)
	case v.null:
		return append(b, "null"...)
	case v.numeric:
		return append(b, v.text...)
	default:
		return jacksonString(b, v.text)
	}
}

// buildDebeziumRecord makes the record of row in the debezium format, without its topic.
func buildDebeziumRecord(row Row, cols config.Columns, d *DebeziumFormat) (*kgo.Record, error) {
	rec := &kgo.Record{Headers: make([]kgo.RecordHeader, 0, 1+len(d.Fields))}
	var problem error
	id := debeziumValue(row, cols.EventID)
	if id.null || id.text == "" {
		problem = &undeliverable{reason: fmt.Sprintf("column %s (event id, which consumers deduplicate on) is NULL or empty", cols.EventID)}
	}
	rec.Headers = append(rec.Headers, connectHeader(DebeziumHeaderID, id))
	// JsonConverter writes strings; bytes that are not UTF-8 (an SQL_ASCII database stores any)
	// would come out as U+FFFD, the value changed for good: such a row is dead-lettered instead,
	// its bytes kept in the dead-letter record.
	raw := false // the record is to carry the stored bytes (notUTF8)
	notUTF8 := func(column string, v connectValue) {
		if problem == nil && d.JSON && !v.null && !v.numeric && !utf8.ValidString(v.text) {
			raw = true
			problem = &undeliverable{reason: fmt.Sprintf("column %s holds bytes that are not UTF-8 (the database's encoding is SQL_ASCII): the json converter (kafka.debezium.converter) cannot write them without changing them; the string converter passes them through", column)}
		}
	}
	if key := debeziumValue(row, cols.AggregateID); !key.null {
		notUTF8(cols.AggregateID, key)
		// A NULL key stays NULL, as Debezium sends it (the record then has no per-aggregate order).
		if d.JSON {
			rec.Key = key.json(nil)
		} else {
			rec.Key = []byte(key.text)
		}
	}
	payload := debeziumValue(row, cols.Payload)
	notUTF8(cols.Payload, payload)
	var payloadJSON []byte // the payload as JsonConverter writes it
	if d.JSON {
		payloadJSON = payload.json(nil)
		if d.ExpandJSONPayload && !payload.null && payload.expanded == nil {
			if expanded, ok := expandJSON(payload.text); ok {
				payloadJSON = expanded
			}
		}
	}
	envelope := false
	for _, f := range d.Fields {
		switch f.Placement {
		case config.PlacementHeader:
			rec.Headers = append(rec.Headers, connectHeader(f.Alias, debeziumValue(row, f.Column)))
		case config.PlacementEnvelope:
			envelope = true
		case config.PlacementPartition:
			v := debeziumValue(row, f.Column)
			if v.null {
				continue
			}
			n, err := strconv.ParseInt(v.text, 10, 32)
			if err != nil || n < 0 {
				if problem == nil {
					problem = &undeliverable{reason: fmt.Sprintf("column %s (the partition, kafka.debezium.additional_placement) holds %q, not a partition number", f.Column, v.text)}
				}
				continue
			}
			place(rec, int32(n))
		}
	}
	switch {
	case d.TombstoneOnEmptyPayload && (payload.null || strings.TrimFunc(payload.text, func(r rune) bool { return r <= ' ' }) == ""):
		rec.Value = nil
	case envelope:
		b := append([]byte(`{"payload":`), payloadJSON...)
		for _, f := range d.Fields {
			if f.Placement == config.PlacementEnvelope {
				b = append(b, ',')
				b = jacksonString(b, f.Alias)
				b = append(b, ':')
				v := debeziumValue(row, f.Column)
				notUTF8(f.Column, v)
				b = v.json(b)
			}
		}
		rec.Value = append(b, '}')
	case d.JSON:
		rec.Value = payloadJSON
	case !payload.null:
		rec.Value = []byte(payload.text)
	}
	if raw {
		// The dead-letter record keeps the stored bytes: key and payload as the string converter
		// writes them.
		rec.Key = nil
		if key := debeziumValue(row, cols.AggregateID); !key.null {
			rec.Key = []byte(key.text)
		}
		rec.Value = nil
		if !payload.null {
			rec.Value = []byte(payload.text)
		}
	}
	return rec, problem
}

// connectHeader is a header as Connect's SimpleHeaderConverter writes v: its string form, or no value.
func connectHeader(key string, v connectValue) kgo.RecordHeader {
	if v.null {
		return kgo.RecordHeader{Key: key}
	}
	return kgo.RecordHeader{Key: key, Value: []byte(v.text)}
}

// placedKey marks, in a record's Context, a record whose Partition was chosen by its row
// (kafka.debezium.additional_placement column:partition).
type placedKey struct{}

// place sends rec to partition n.
func place(rec *kgo.Record, n int32) {
	rec.Partition = n
	rec.Context = context.WithValue(context.Background(), placedKey{}, true)
}

// placed reports whether rec's partition was chosen by its row.
func placed(rec *kgo.Record) bool {
	return rec.Context != nil && rec.Context.Value(placedKey{}) != nil
}

// placingPartitioner sends a placed record to its own partition and every other record where the
// inner partitioner would (Kafka's murmur2 of the key, as Java's default partitioner).
type placingPartitioner struct{ inner kgo.Partitioner }

// ForTopic implements kgo.Partitioner.
func (p placingPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return placingTopicPartitioner{p.inner.ForTopic(topic)}
}

type placingTopicPartitioner struct{ inner kgo.TopicPartitioner }

func (p placingTopicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return placed(r) || p.inner.RequiresConsistency(r)
}

func (p placingTopicPartitioner) Partition(r *kgo.Record, n int) int {
	if placed(r) {
		return int(r.Partition)
	}
	return p.inner.Partition(r, n)
}

func (p placingTopicPartitioner) PartitionByBackup(r *kgo.Record, n int, it kgo.TopicBackupIter) int {
	if placed(r) {
		return int(r.Partition)
	}
	if b, ok := p.inner.(kgo.TopicBackupPartitioner); ok {
		return b.PartitionByBackup(r, n, it)
	}
	return p.inner.Partition(r, n)
}

func (p placingTopicPartitioner) OnNewBatch() {
	if b, ok := p.inner.(kgo.TopicPartitionerOnNewBatch); ok {
		b.OnNewBatch()
	}
}
