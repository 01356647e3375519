package router

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox"
)

func TestBuildRecord(t *testing.T) {
	row := mapRow{
		"event_id": "7d1c4d6a-0000-4000-8000-000000000001", "event_type": "OrderPaid", "aggregate_type": "order",
		"aggregate_id": "42", "aggregate_version": "7", "payload": `{"total": 9.99}`, "created_at": "2026-12-02T08:00:00Z",
		"headers": `{"traceparent": "00-abc-def-01", "retries": 2, "event_id": "spoofed", "note": null, "outbox.dlq.reason": "spoofed"}`,
	}
	rec, err := buildRecord(row, defaultCols, Format{})
	if err != nil {
		t.Fatal(err)
	}
	if string(rec.Key) != "42" || string(rec.Value) != `{"total": 9.99}` {
		t.Fatalf("key %q value %q", rec.Key, rec.Value)
	}
	want := map[string]string{
		"event_id": "7d1c4d6a-0000-4000-8000-000000000001", "event_type": "OrderPaid", "aggregate_type": "order",
		"aggregate_version": "7", "created_at": "2026-12-02T08:00:00Z", "traceparent": "00-abc-def-01", "retries": "2", // "note": null is no header
	}
	checkHeaders(t, rec, want)
}

// checkHeaders checks that rec has exactly the headers of want, each once.
func checkHeaders(t *testing.T, rec *kgo.Record, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, h := range rec.Headers {
		if _, dup := got[h.Key]; dup {
			t.Errorf("header %s appears twice", h.Key)
		}
		got[h.Key] = string(h.Value)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("headers %v, want %v", got, want)
	}
}

func TestBuildRecordProblems(t *testing.T) {
	tests := []struct {
		name string
		row  mapRow
		want string
	}{
		{"null aggregate id", mapRow{"event_id": "e", "event_type": "A", "payload": "{}"}, "aggregate id"},
		{"empty aggregate id", mapRow{"event_id": "e", "event_type": "A", "aggregate_id": "", "payload": "{}"}, "aggregate id"},
		{"null event id", mapRow{"event_type": "A", "aggregate_id": "1", "payload": "{}"}, "event id, which consumers deduplicate on"},
		{"headers not an object", mapRow{"event_id": "e", "event_type": "A", "aggregate_id": "1", "payload": "{}", "headers": "[1,2]"}, "JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := buildRecord(tt.row, defaultCols, Format{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
			if rec == nil || string(rec.Value) != "{}" {
				t.Fatal("the record for the dead-letter topic must keep the value")
			}
		})
	}
}

func TestNullPayloadIsATombstone(t *testing.T) {
	rec, err := buildRecord(mapRow{"event_id": "e", "event_type": "A", "aggregate_id": "1"}, defaultCols, Format{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Value != nil {
		t.Fatalf("value %q, want nil", rec.Value)
	}
}

// TestDeadLetterRecordAlwaysFits: whatever the row held — a huge value, a huge key, huge headers —
// the dead-letter record fits the limit, keeps its own headers whole, marks every cut with the
// original size, and holds copies, not prefixes of the row's buffers.
func TestDeadLetterRecordAlwaysFits(t *testing.T) {
	big := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	own := []kgo.RecordHeader{{Key: outbox.HeaderDLQReason, Value: []byte("too large")}, {Key: outbox.HeaderDLQSourceLSN, Value: []byte("0/1")}}
	tests := []struct {
		name                string
		key, value          []byte
		headers             []kgo.RecordHeader
		wantMarks, wantGone []string
	}{
		{"fits as is", []byte("k"), []byte("v"), nil, nil, []string{outbox.HeaderDLQTruncated, outbox.HeaderDLQKeyTruncated, outbox.HeaderDLQHeadersDropped}},
		{"large value", []byte("k"), big(50000), nil, []string{outbox.HeaderDLQTruncated, outbox.HeaderDLQOriginalBytes}, []string{outbox.HeaderDLQKeyTruncated}},
		{"large headers", []byte("k"), big(1000), []kgo.RecordHeader{{Key: "trace", Value: big(40000)}}, []string{outbox.HeaderDLQHeadersDropped, outbox.HeaderDLQOriginalHeaderSize},
			[]string{outbox.HeaderDLQKeyTruncated, outbox.HeaderDLQTruncated}},
		{"large value, the event's attributes kept", []byte("k"), big(50000), []kgo.RecordHeader{{Key: "ce_id", Value: []byte("e1")}, {Key: "ce_type", Value: []byte("T")},
			{Key: "ce_source", Value: []byte("/s")}, {Key: "event_id", Value: []byte("e1")}, {Key: "trace", Value: big(100)}},
			[]string{outbox.HeaderDLQTruncated}, []string{outbox.HeaderDLQHeadersDropped}},
		{"large key", big(40000), []byte("v"), nil, []string{outbox.HeaderDLQKeyTruncated, outbox.HeaderDLQOriginalKeyBytes}, nil},
		{"everything large", big(30000), big(30000), []kgo.RecordHeader{{Key: "a", Value: big(30000)}, {Key: "b", Value: big(30000)}},
			[]string{outbox.HeaderDLQTruncated, outbox.HeaderDLQHeadersDropped, outbox.HeaderDLQKeyTruncated}, nil},
	}
	const limit = 4096
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, value := bytes.Clone(tt.key), bytes.Clone(tt.value)
			rec := &kgo.Record{Topic: "dlq", Key: key, Value: value, Headers: slices.Clone(tt.headers)}
			fitDLQ(rec, own, limit)
			if n := recordSize(rec); n > limit {
				t.Fatalf("dead-letter record of %d bytes, limit %d", n, limit)
			}
			for _, h := range own {
				if header(rec, h.Key) != string(h.Value) {
					t.Errorf("dead-letter header %s lost", h.Key)
				}
			}
			for _, k := range tt.wantMarks {
				if header(rec, k) == "" {
					t.Errorf("marker %s missing: %v", k, rec.Headers)
				}
			}
			for _, k := range tt.wantGone {
				if header(rec, k) != "" {
					t.Errorf("marker %s set though nothing was cut", k)
				}
			}
			for _, h := range tt.headers {
				if (isOutboxHeader(h.Key) || isCloudEventsHeader(h.Key)) && header(rec, h.Key) != string(h.Value) {
					t.Errorf("the event's attribute %s was dropped from its dead letter", h.Key)
				}
			}
			if header(rec, outbox.HeaderDLQTruncated) == "" && !bytes.Equal(rec.Value, tt.value) {
				t.Errorf("the value changed though it was not marked cut")
			}
			if got := header(rec, outbox.HeaderDLQOriginalBytes); got != "" && got != strconv.Itoa(len(tt.value)) {
				t.Errorf("original value bytes %s, want %d", got, len(tt.value))
			}
			// The kept bytes must not alias the row's (large) buffers.
			if len(tt.value) > limit && len(rec.Value) > 0 && &rec.Value[0] == &value[0] {
				t.Error("the cut value shares the row's buffer")
			}
			if len(tt.key) > limit && len(rec.Key) > 0 && &rec.Key[0] == &key[0] {
				t.Error("the cut key shares the row's buffer")
			}
		})
	}
}

func TestRecordSizeNeverUnderestimates(t *testing.T) {
	rec := &kgo.Record{Key: []byte("42"), Value: bytes.Repeat([]byte("v"), 300), Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("e")}}}
	// A batch of one record: 61 bytes of batch header, the record's varints, key, value, headers.
	min := 61 + len(rec.Key) + len(rec.Value) + len("event_id") + 1
	if n := recordSize(rec); n < min || n > min+60 {
		t.Fatalf("recordSize %d, want between %d and %d", n, min, min+60)
	}
}

// typedMapRow is a mapRow whose columns have PostgreSQL types.
type typedMapRow struct {
	mapRow
	types map[string]uint32
}

func (r typedMapRow) TypeOID(col string) (uint32, bool) {
	oid, ok := r.types[col]
	return oid, ok
}

func TestBuildCloudEventsRecord(t *testing.T) {
	row := typedMapRow{mapRow: mapRow{
		"event_id": "7d1c4d6a-0000-4000-8000-000000000001", "event_type": "OrderPaid", "aggregate_type": "order",
		"aggregate_id": "42", "aggregate_version": "7", "payload": `{"total": 9.99}`, "created_at": "2026-12-02 08:00:00.123456+01",
		"headers": `{"traceparent": "00-abc-def-01", "ce_id": "spoofed", "CE_TYPE": "spoofed", "content-type": "text/html", "event_id": "spoofed"}`,
	}, types: map[string]uint32{"payload": 3802}}
	rec, err := buildRecord(row, defaultCols, Format{CloudEvents: true, Source: "/app/public.outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if string(rec.Key) != "42" || string(rec.Value) != `{"total": 9.99}` {
		t.Fatalf("key %q value %q", rec.Key, rec.Value)
	}
	want := map[string]string{
		"ce_specversion": "1.0", "ce_id": "7d1c4d6a-0000-4000-8000-000000000001", "ce_source": "/app/public.outbox",
		"ce_type": "OrderPaid", "ce_subject": "42", "ce_time": "2026-12-02T07:00:00.123456Z", "content-type": "application/json",
		"ce_aggregatetype": "order", "ce_aggregateversion": "7", "traceparent": "00-abc-def-01",
	}
	checkHeaders(t, rec, want)
	if eventID(rec) != want["ce_id"] || header(rec, ceType) != "OrderPaid" {
		t.Errorf("eventID %q ce_type %q", eventID(rec), header(rec, ceType))
	}
}

func TestCloudEventsAttributes(t *testing.T) {
	f := Format{CloudEvents: true, Source: "/s"}
	base := func() mapRow {
		return mapRow{"event_id": "e", "event_type": "A", "aggregate_id": "1", "payload": "x"}
	}
	t.Run("a row without a type cannot be a CloudEvent", func(t *testing.T) {
		row := base()
		delete(row, "event_type")
		if _, err := buildRecord(row, defaultCols, f); err == nil || !strings.Contains(err.Error(), "CloudEvent must have a type") {
			t.Fatalf("got %v", err)
		}
	})
	for _, tt := range []struct{ in, want string }{
		{"2026-12-02 08:00:00+00", "2026-12-02T08:00:00Z"},
		{"2026-12-02 08:00:00.5+05:30", "2026-12-02T02:30:00.5Z"},
		{"1900-01-01 00:00:00+00:09:21", "1899-12-31T23:50:39Z"},
		{"2026-12-02 08:00:00", "2026-12-02T08:00:00Z"},
		{"2026-12-02T08:00:00Z", "2026-12-02T08:00:00Z"},
		{"infinity", ""},
	} {
		row := base()
		row["created_at"] = tt.in
		rec, err := buildRecord(row, defaultCols, f)
		if err != nil {
			t.Fatal(err)
		}
		if got := header(rec, "ce_time"); got != tt.want {
			t.Errorf("created_at %q: ce_time %q, want %q", tt.in, got, tt.want)
		}
	}
	for oid, want := range map[uint32]string{114: "application/json", 3802: "application/json", 25: "text/plain; charset=utf-8", 17: "application/octet-stream", 142: "application/xml", 23: ""} {
		rec, err := buildRecord(typedMapRow{mapRow: base(), types: map[string]uint32{"payload": oid}}, defaultCols, f)
		if err != nil {
			t.Fatal(err)
		}
		if got := header(rec, "content-type"); got != want {
			t.Errorf("payload type %d: content-type %q, want %q", oid, got, want)
		}
	}
	tomb := base()
	delete(tomb, "payload")
	rec, _ := buildRecord(typedMapRow{mapRow: tomb, types: map[string]uint32{"payload": 3802}}, defaultCols, f)
	if header(rec, "content-type") != "" {
		t.Error("a tombstone (no data) has no content-type")
	}
}

// TestCloudEventsForbiddenCharacters: an attribute value CloudEvents forbids (a control character, a
// noncharacter, invalid UTF-8) makes the row undeliverable with the reason, whichever attribute holds it.
func TestCloudEventsForbiddenCharacters(t *testing.T) {
	f := Format{CloudEvents: true, Source: "/s"}
	for _, tt := range []struct{ column, value string }{
		{"event_type", "Order\nPaid"}, {"aggregate_id", "42\x00"}, {"event_id", "e\u0085"}, {"aggregate_type", "order\uFFFE"},
		{"aggregate_version", "7\x7f"}, {"event_type", "bad\xff"},
	} {
		row := mapRow{"event_id": "e", "event_type": "A", "aggregate_id": "1", "payload": "x", "aggregate_type": "o", "aggregate_version": "1"}
		row[tt.column] = tt.value
		_, err := buildRecord(row, defaultCols, f)
		var u *undeliverable
		if !errors.As(err, &u) || !strings.Contains(u.reason, "CloudEvents forbids") {
			t.Errorf("%s = %q: %v, want an undeliverable row", tt.column, tt.value, err)
		}
		if _, err := buildRecord(row, defaultCols, Format{}); err != nil {
			t.Errorf("%s = %q in the outbox format: %v (any bytes go in outbox headers)", tt.column, tt.value, err)
		}
	}
	if _, err := buildRecord(mapRow{"event_id": "e", "event_type": "Bestellung-geändert", "aggregate_id": "1", "payload": "x"}, defaultCols, f); err != nil {
		t.Errorf("non-ASCII letters refused: %v", err)
	}
}

// TestJSONHeadersKeepStoredBytes: a headers object's string values become header values: escapes
// decoded, and bytes that are not UTF-8 (an SQL_ASCII database stores any) kept as they are rather
// than replaced; other values as their JSON text; null ones left out.
func TestJSONHeadersKeepStoredBytes(t *testing.T) {
	raw := []byte("{\"plain\": \"abc\", \"escaped\": \"a\\\"b\\u00e9\\n\", \"stored\": \"caf\xe9\", \"n\": 42, \"obj\": {\"a\": 1}, \"gone\": null, \"empty\": \"\"}")
	hs, err := jsonHeaders(raw, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range hs {
		got[h.Key] = string(h.Value)
	}
	want := map[string]string{"plain": "abc", "escaped": "a\"b\u00e9\n", "stored": "caf\xe9", "n": "42", "obj": `{"a": 1}`, "empty": ""}
	if len(got) != len(want) {
		t.Errorf("headers %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
}

// TestJSONHeadersNeverChangeAValue: decoding JSON turns an unpaired surrogate escape (a json column,
// unlike jsonb, takes "\ud800") and bytes that are not UTF-8 beside escapes into U+FFFD; such a
// headers object is refused (the row is dead-lettered with the reason) rather than its value changed,
// while U+FFFD written in the object, as itself or escaped, is a value like any other.
func TestJSONHeadersNeverChangeAValue(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      string // the header a's value; "" for a refusal naming wantErr
		wantErr   string
	}{
		{"lone high surrogate", `{"a": "x\ud800y"}`, "", `header "a"`},
		{"lone low surrogate", `{"a": "\uDC00"}`, "", `header "a"`},
		{"reversed pair", `{"a": "\udc00\ud800"}`, "", `header "a"`},
		{"not UTF-8 beside an escape", "{\"a\": \"caf\xe9\\n\"}", "", `header "a"`},
		{"name not UTF-8", "{\"caf\xe9\": \"x\"}", "", "header name"},
		{"name with a lone surrogate", `{"\ud800": "x"}`, "", "header name"},
		{"a pair", `{"a": "\ud83d\ude00"}`, "\U0001F600", ""},
		{"U+FFFD escaped", `{"a": "\ufffd\n"}`, "\uFFFD\n", ""},
		{"U+FFFD as itself", "{\"a\": \"\uFFFD\\n\"}", "\uFFFD\n", ""},
		// Not an object: refused the same way, whatever it is, naming what it is.
		{"an array", `[{"a": "x"}]`, "", "not an array"},
		{"a string", `"a=x"`, "", "not a string"},
		{"a number", `42`, "", "not a number"},
		{"a boolean", `true`, "", "not a boolean"},
		{"a malformed object", `{"a": "x"`, "", "not a malformed object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, err := jsonHeaders([]byte(tc.raw), func(string) bool { return false })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("headers %q, error %v: want a refusal naming %s", hs, err, tc.wantErr)
				}
				return
			}
			if err != nil || len(hs) != 1 || string(hs[0].Value) != tc.want {
				t.Fatalf("headers %q, error %v: want a = %q", hs, err, tc.want)
			}
		})
	}
}
