package router

import (
	"strings"
	"testing"
)

func TestBuildRecord(t *testing.T) {
	row := mapRow{
		"event_id": "7d1c4d6a-0000-4000-8000-000000000001", "event_type": "OrderPaid", "aggregate_type": "order",
		"aggregate_id": "42", "aggregate_version": "7", "payload": `{"total": 9.99}`, "created_at": "2026-12-02T08:00:00Z",
		"headers": `{"traceparent": "00-abc-def-01", "retries": 2, "event_id": "spoofed", "note": null}`,
	}
	rec, err := buildRecord(row, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	if string(rec.Key) != "42" || string(rec.Value) != `{"total": 9.99}` {
		t.Fatalf("key %q value %q", rec.Key, rec.Value)
	}
	want := map[string]string{
		"event_id": "7d1c4d6a-0000-4000-8000-000000000001", "event_type": "OrderPaid", "aggregate_type": "order",
		"aggregate_version": "7", "created_at": "2026-12-02T08:00:00Z", "traceparent": "00-abc-def-01", "retries": "2", "note": "",
	}
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
		{"null aggregate id", mapRow{"event_type": "A", "payload": "{}"}, "aggregate id"},
		{"empty aggregate id", mapRow{"event_type": "A", "aggregate_id": "", "payload": "{}"}, "aggregate id"},
		{"headers not an object", mapRow{"event_type": "A", "aggregate_id": "1", "payload": "{}", "headers": "[1,2]"}, "JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := buildRecord(tt.row, defaultCols)
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
	rec, err := buildRecord(mapRow{"event_type": "A", "aggregate_id": "1"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Value != nil {
		t.Fatalf("value %q, want nil", rec.Value)
	}
}
