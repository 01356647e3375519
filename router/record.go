package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

var reservedHeaders = map[string]bool{
	outbox.HeaderEventID: true, outbox.HeaderEventType: true, outbox.HeaderAggregateType: true, outbox.HeaderAggregateVersion: true, outbox.HeaderCreatedAt: true,
}

// Format says which headers carry a record's event attributes (kafka.header_format).
type Format struct {
	// CloudEvents selects the CloudEvents Kafka protocol binding in binary mode: the attributes as
	// ce_* headers and content-type, the payload untouched as the value. Otherwise the outbox
	// headers (event_id, event_type, ...) carry them.
	CloudEvents bool
	// Source is the ce_source attribute of every record in CloudEvents format.
	Source string
	// Debezium, if not nil, selects the debezium format (and CloudEvents is false).
	Debezium *DebeziumFormat
}

// typedRow is a Row that also knows its columns' PostgreSQL types (replication and snapshot rows do).
type typedRow interface {
	TypeOID(column string) (uint32, bool)
}

// buildRecord makes the record for row without its topic: key = aggregate_id, value = payload bytes
// as stored, headers from the row's columns (in the format f says) and every key of its headers JSON
// object. A row that can never be a valid record returns an *undeliverable error; the record returned
// with it still carries what could be read, for the dead-letter topic.
func buildRecord(row Row, cols config.Columns, f Format) (*kgo.Record, error) {
	return buildRecordIn(nil, row, cols, f)
}

// buildRecordIn is buildRecord with the record made in space (nil: a new one), so that a caller that
// holds a recordWithHeaders already (Prepared) allocates nothing more for it.
func buildRecordIn(space *recordWithHeaders, row Row, cols config.Columns, f Format) (*kgo.Record, error) {
	if f.Debezium != nil {
		rec, err := buildDebeziumRecord(row, cols, f.Debezium)
		addTraceContext(rec, row, cols.TraceContext, false)
		return rec, err
	}
	rec := space.init()
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
	reserved := isOutboxHeader
	if f.CloudEvents {
		reserved = isCloudEventsHeader
		if t, ok := row.Value(cols.EventType); (!ok || len(t) == 0) && problem == nil {
			problem = &undeliverable{reason: fmt.Sprintf("column %s (event type) is NULL or empty: a CloudEvent must have a type (kafka.header_format is cloudevents)", cols.EventType)}
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ceSpecVersion, Value: []byte("1.0")})
		add(ceID, cols.EventID)
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ceSource, Value: []byte(f.Source)})
		add(ceType, cols.EventType)
		add(ceSubject, cols.AggregateID)
		if cols.CreatedAt != "" {
			if v, ok := row.Value(cols.CreatedAt); ok {
				if ts, ok := rfc3339(v); ok {
					rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ceTime, Value: ts})
				}
			}
		}
		if ct := contentType(row, cols.Payload); ct != "" && rec.Value != nil {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ceContentType, Value: []byte(ct)})
		}
		add(ceAggregateType, cols.AggregateType)
		add(ceAggregateVersion, cols.AggregateVersion)
		if problem == nil {
			for _, h := range rec.Headers {
				if at, r := forbiddenInCloudEvents(h.Value); at >= 0 {
					problem = &undeliverable{reason: fmt.Sprintf("CloudEvents attribute %s holds a character CloudEvents forbids (%U at byte %d): control characters, surrogates and noncharacters may not be used (kafka.header_format is cloudevents)",
						strings.TrimPrefix(h.Key, "ce_"), r, at)}
					break
				}
			}
		}
	} else {
		add(outbox.HeaderEventID, cols.EventID)
		add(outbox.HeaderEventType, cols.EventType)
		add(outbox.HeaderAggregateType, cols.AggregateType)
		add(outbox.HeaderAggregateVersion, cols.AggregateVersion)
		add(outbox.HeaderCreatedAt, cols.CreatedAt)
	}
	if cols.Headers != "" {
		if raw, ok := row.Value(cols.Headers); ok && len(bytes.TrimSpace(raw)) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			extra, err := jsonHeaders(raw, reserved)
			if err != nil && problem == nil {
				problem = &undeliverable{reason: fmt.Sprintf("column %s: %v", cols.Headers, err)}
			}
			rec.Headers = append(rec.Headers, extra...)
		}
	}
	addTraceContext(rec, row, cols.TraceContext, f.CloudEvents)
	return rec, problem
}

// The CloudEvents Kafka protocol binding's headers (binary content mode): every attribute as a
// header named ce_<attribute>, and the data's media type as content-type. aggregatetype and
// aggregateversion are extension attributes.
const (
	ceSpecVersion      = "ce_specversion"
	ceID               = "ce_id"
	ceSource           = "ce_source"
	ceType             = "ce_type"
	ceSubject          = "ce_subject"
	ceTime             = "ce_time"
	ceContentType      = "content-type"
	ceAggregateType    = "ce_aggregatetype"
	ceAggregateVersion = "ce_aggregateversion"
)

// isOutboxHeader reports the header names a row's own headers may not take in the outbox format.
func isOutboxHeader(k string) bool {
	return reservedHeaders[k] || strings.HasPrefix(k, outbox.DLQHeaderPrefix)
}

// isCloudEventsHeader reports the header names a row's own headers may not take in the CloudEvents
// format: any attribute (a consumer's SDK would read it as one), content-type, and the outbox format's
// names (tools that read either format must not be misled).
func isCloudEventsHeader(k string) bool {
	return strings.HasPrefix(strings.ToLower(k), "ce_") || strings.EqualFold(k, ceContentType) || isOutboxHeader(k)
}

// forbiddenInCloudEvents returns the byte offset and the rune of the first character a CloudEvents
// String may not hold — a control character (U+0000-U+001F, U+007F-U+009F), invalid UTF-8 (a
// surrogate among it), or a noncharacter — or -1.
func forbiddenInCloudEvents(v []byte) (int, rune) {
	for i, r := range string(v) {
		switch {
		case r == utf8.RuneError:
			if _, size := utf8.DecodeRune(v[i:]); size <= 1 {
				return i, r
			}
		case r <= 0x1f, r >= 0x7f && r <= 0x9f, r >= 0xfdd0 && r <= 0xfdef, r&0xfffe == 0xfffe:
			return i, r
		}
	}
	return -1, 0
}

// contentType is the media type of a payload column by its PostgreSQL type: application/json for
// json and jsonb, text/plain for text types, application/octet-stream for bytea; "" when unknown.
func contentType(row Row, column string) string {
	tr, ok := row.(typedRow)
	if !ok {
		return ""
	}
	oid, ok := tr.TypeOID(column)
	if !ok {
		return ""
	}
	switch oid {
	case 114, 3802: // json, jsonb
		return "application/json"
	case 25, 1043, 1042: // text, varchar, bpchar
		return "text/plain; charset=utf-8"
	case 17: // bytea
		return "application/octet-stream"
	case 142: // xml
		return "application/xml"
	}
	return ""
}

// pgTimeLayouts are PostgreSQL's ISO text forms of timestamptz (offsets of hours, minutes or seconds)
// and of timestamp, taken as UTC.
var pgTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999Z07",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07:00:00",
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999",
}

// rfc3339 converts a timestamp column's text (PostgreSQL's ISO output) to RFC 3339 in UTC, as
// ce_time requires; false when the text is not a timestamp (another DateStyle, infinity).
func rfc3339(v []byte) ([]byte, bool) {
	s := string(v)
	for _, layout := range pgTimeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC().AppendFormat(nil, time.RFC3339Nano), true
		}
	}
	return nil, false
}

// jsonKind names what kind of JSON value raw starts with, for the reason a headers value that is not
// an object is refused.
func jsonKind(raw []byte) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "empty"
	}
	switch c := t[0]; {
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	case c == '{':
		return "a malformed object"
	}
	return "JSON"
}

// jsonHeaders turns a JSON object into headers in key order: string values as they are, other
// values as their JSON text, null ones left out. Keys reserved for the record's own headers are left
// out.
func jsonHeaders(raw []byte, reserved func(string) bool) ([]kgo.RecordHeader, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("headers must be a JSON object (or NULL), not %s: %v", jsonKind(raw), err)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		if strings.ContainsRune(k, utf8.RuneError) && replacements(raw) == 0 {
			return nil, fmt.Errorf("a header name, %q as decoded, holds bytes that are not UTF-8 or an unpaired UTF-16 surrogate escape (\\ud800-\\udfff alone), which no header name can carry as written", k)
		}
		if !reserved(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]kgo.RecordHeader, 0, len(keys))
	for _, k := range keys {
		v := obj[k]
		if len(v) >= 2 && v[0] == '"' {
			// Without escapes, the bytes between the quotes are the value, as stored: an SQL_ASCII
			// database's bytes that are not UTF-8 stay what they are (decoding would replace them).
			if inner := v[1 : len(v)-1]; bytes.IndexByte(inner, '\\') < 0 {
				out = append(out, kgo.RecordHeader{Key: k, Value: inner})
				continue
			}
			var s string
			if json.Unmarshal(v, &s) == nil {
				// Decoding replaces an unpaired surrogate escape (a json column takes "\ud800") and
				// bytes that are not UTF-8 with U+FFFD: the value would change for good.
				if strings.Count(s, string(utf8.RuneError)) > replacements(v) {
					return nil, fmt.Errorf("header %q holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff alone) or bytes that are not UTF-8 beside escapes: its value cannot be carried as written", k)
				}
				out = append(out, kgo.RecordHeader{Key: k, Value: []byte(s)})
				continue
			}
		}
		if string(v) == "null" {
			continue // no value, no header: a header without a value breaks some consumers' SDKs
		}
		out = append(out, kgo.RecordHeader{Key: k, Value: append([]byte(nil), v...)})
	}
	return out, nil
}

// replacements counts the U+FFFD characters raw JSON text holds, as UTF-8 or as a \ufffd escape:
// those a decoded string may hold without anything replaced.
func replacements(raw []byte) int {
	n := bytes.Count(raw, []byte(string(utf8.RuneError)))
	for i := bytes.Index(raw, []byte(`\u`)); i >= 0; i = bytes.Index(raw, []byte(`\u`)) {
		if len(raw) >= i+6 && strings.EqualFold(string(raw[i+2:i+6]), "fffd") {
			n++
		}
		raw = raw[i+2:]
	}
	return n
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

// eventID is a record's event id, in any format.
func eventID(r *kgo.Record) string {
	for _, key := range []string{outbox.HeaderEventID, ceID, DebeziumHeaderID} {
		if id := header(r, key); id != "" {
			return id
		}
	}
	return ""
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

// recordWithHeaders is a record and room for its usual headers, allocated together (and with the
// rest of a Prepared): one allocation per row instead of three.
type recordWithHeaders struct {
	rec     kgo.Record
	headers [8]kgo.RecordHeader
}

// init makes s an empty record with room for 8 headers and returns it; a nil s allocates one.
func (s *recordWithHeaders) init() *kgo.Record {
	if s == nil {
		s = new(recordWithHeaders)
	}
	s.rec = kgo.Record{Headers: s.headers[:0]}
	return &s.rec
}
