package replication

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// messageRoles are the default columns' roles as the pipeline passes them.
var messageRoles = []ColumnRole{
	{Column: "event_id", Key: "postgres.columns.event_id", Required: true},
	{Column: "event_type", Key: "postgres.columns.event_type", Required: true},
	{Column: "aggregate_id", Key: "postgres.columns.aggregate_id", Required: true},
	{Column: "payload", Key: "postgres.columns.payload", Required: true},
	{Column: "aggregate_type", Key: "postgres.columns.aggregate_type"},
	{Column: "aggregate_version", Key: "postgres.columns.aggregate_version"},
	{Column: "headers", Key: "postgres.columns.headers"},
	{Column: "created_at", Key: "postgres.columns.created_at"},
}

func TestMessageRow(t *testing.T) {
	commit := time.Date(2026, 12, 7, 21, 30, 0, 123000000, time.UTC)
	const good = `"event_id": "e1", "event_type": "Placed", "aggregate_id": "42"`
	tests := []struct {
		name, content string
		problem       string            // a part of the Problem; "" for none
		values        map[string]string // column values the row must have ("<null>" for NULL)
		oids          map[string]uint32
	}{
		{name: "every field", content: `{` + good + `, "aggregate_type": "order", "aggregate_version": 7, "payload": {"total": 9.99}, "headers": {"a": "b"}, "created_at": "2026-01-01T00:00:00Z"}`,
			values: map[string]string{"event_id": "e1", "event_type": "Placed", "aggregate_id": "42", "aggregate_type": "order", "aggregate_version": "7",
				"payload": `{"total": 9.99}`, "headers": `{"a": "b"}`, "created_at": "2026-01-01T00:00:00Z"},
			oids: map[string]uint32{"payload": oidJSONB, "aggregate_version": oidNumeric, "event_id": oidText}},
		{name: "a string payload is its text", content: `{` + good + `, "payload": "plain \u00e9"}`,
			values: map[string]string{"payload": "plain é"}, oids: map[string]uint32{"payload": oidText}},
		{name: "created_at is the commit time when absent", content: `{` + good + `, "payload": 1}`,
			values: map[string]string{"created_at": "2026-12-07T21:30:00.123Z", "payload": "1", "headers": "<null>"}},
		{name: "a null payload is NULL", content: `{` + good + `, "payload": null}`, values: map[string]string{"payload": "<null>"}},
		{name: "no payload", content: `{` + good + `}`, problem: `lacks field "payload"`},
		{name: "not UTF-8", content: "{\xff}", problem: "not UTF-8", values: map[string]string{"payload": "{\xff}"}},
		{name: "not JSON", content: `{"event_id": `, problem: "not JSON", values: map[string]string{"payload": `{"event_id": `}},
		{name: "two values", content: `{} {}`, problem: "more than one JSON value"},
		{name: "a string", content: `"x"`, problem: "a JSON string, not an object"},
		{name: "null", content: `null`, problem: "JSON null"},
		{name: "no event type", content: `{"event_id": "e1", "aggregate_id": "42", "payload": {}}`, problem: `lacks field "event_type"`},
		{name: "an object as the key", content: `{"event_id": "e1", "event_type": "Placed", "aggregate_id": {"x": 1}, "payload": {}}`, problem: `"aggregate_id" (postgres.columns.aggregate_id): a string expected, got an object`},
		{name: "headers an array", content: `{` + good + `, "payload": {}, "headers": [1]}`, problem: "got an array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			row := messageRow([]byte(tt.content), messageRoles, commit, 99)
			if got := row.Problem(); (tt.problem == "") != (got == "") || !strings.Contains(got, tt.problem) {
				t.Fatalf("problem %q, want one with %q", got, tt.problem)
			}
			if tt.problem != "" && row.ProblemClass() != ProblemBadMessage {
				t.Errorf("problem class %q, want %q", row.ProblemClass(), ProblemBadMessage)
			}
			for col, want := range tt.values {
				v, ok := row.Value(col)
				if want == "<null>" {
					if ok {
						t.Errorf("%s = %q, want NULL", col, v)
					}
					continue
				}
				if !ok || string(v) != want {
					t.Errorf("%s = %q (present %v), want %q", col, v, ok, want)
				}
			}
			for col, want := range tt.oids {
				if oid, _ := row.TypeOID(col); oid != want {
					t.Errorf("%s has type %d, want %d", col, oid, want)
				}
			}
			if row.LSN != 99 {
				t.Errorf("LSN %d, want 99", row.LSN)
			}
		})
	}
}

// FuzzMessageRow: whatever a message holds, messageRow returns a row (with a Problem, or with every
// required column, from content encoding/json finds valid) and never panics.
func FuzzMessageRow(f *testing.F) {
	for _, seed := range []string{`{}`, `{"event_id": "e", "event_type": "t", "aggregate_id": "a", "payload": {}}`, "\xff", `[`, `{"payload": "\u0000"}`, `{"headers": {"a": 1}}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		row := messageRow(content, messageRoles, time.Unix(0, 0), 1)
		if row.Problem() != "" {
			return
		}
		// What encoding/json refuses is never delivered.
		if !json.Valid(content) {
			t.Fatalf("no problem with content encoding/json finds invalid: %q", content)
		}
		for _, r := range messageRoles {
			if _, ok := row.Value(r.Column); r.Required && !ok {
				t.Fatalf("no problem, but required %s is missing: %q", r.Column, content)
			}
		}
	})
}

// BenchmarkMessageRow is the cost of turning one message's content (the bench's: six fields, a
// 500-byte payload) into a Row.
func BenchmarkMessageRow(b *testing.B) {
	content := []byte(`{"event_id" : "7e0c2b43-0000-4000-8000-000000000001", "event_type" : "OrderPlaced", "aggregate_type" : "order", "aggregate_id" : "order-42", "aggregate_version" : 7, "payload" : {"order_id" : "order-42", "seq" : 42, "note" : "` + strings.Repeat("x", 380) + `"}}`)
	commit := time.Now()
	b.SetBytes(int64(len(content)))
	b.ReportAllocs()
	var r messageReader
	for b.Loop() {
		if row := r.row(content, messageRoles, commit, 1); row.problem != "" {
			b.Fatal(row.problem)
		}
	}
}
