package testenv

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// recorder is a testing.TB that records errors instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }

// TestVerifyDeliveryCatchesOrderFaults checks the checker: in-order delivery and replays pass; an
// event before an earlier one, a stale duplicate, a gap and a cross-topic inversion fail.
func TestVerifyDeliveryCatchesOrderFaults(t *testing.T) {
	f := &Fixture{TopicPrefix: "t"}
	gen := NewGenerator(1, "A")
	var evs []Event
	for i := 0; i < 5; i++ {
		evs = append(evs, gen.Event(0))
	}
	evs = append(evs, Event{ID: "b1", Type: "B", AggType: "order", AggID: "agg-0", Version: 6, Payload: "{}"})
	base := time.Unix(1_800_000_000, 0)
	rec := func(i int, offset int64, at int) *kgo.Record {
		e := evs[i]
		return &kgo.Record{Topic: "t." + e.Type, Key: []byte(e.AggID), Value: []byte(e.Payload), Offset: offset, Timestamp: base.Add(time.Duration(at) * time.Millisecond),
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(e.ID)}, {Key: "event_type", Value: []byte(e.Type)}, {Key: "aggregate_type", Value: []byte(e.AggType)},
				{Key: "aggregate_version", Value: []byte(fmt.Sprint(e.Version))}, {Key: "created_at", Value: []byte("2026-12-02T00:00:00Z")}, {Key: "traceparent", Value: []byte(header(e))}}}
	}
	seq := func(order ...[2]int) []*kgo.Record { // (event, timestamp) in offset order; B's record last
		var out []*kgo.Record
		for n, o := range order {
			out = append(out, rec(o[0], int64(n), o[1]))
		}
		return out
	}
	tests := []struct {
		name string
		got  []*kgo.Record
		want string // "" passes
	}{
		{"in order", seq([2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}, [2]int{3, 4}, [2]int{4, 5}, [2]int{5, 6}), ""},
		{"replay from the slot", seq([2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}, [2]int{1, 10}, [2]int{2, 11}, [2]int{3, 12}, [2]int{4, 13}, [2]int{5, 14}), ""},
		{"replay restarted during a replay", seq([2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}, [2]int{1, 10}, [2]int{0, 20}, [2]int{1, 21}, [2]int{2, 22}, [2]int{3, 23}, [2]int{4, 24}, [2]int{5, 25}), ""},
		{"out of order", seq([2]int{0, 1}, [2]int{2, 2}, [2]int{1, 3}, [2]int{3, 4}, [2]int{4, 5}, [2]int{5, 6}), "order broken"},
		{"stale duplicate", seq([2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}, [2]int{0, 4}, [2]int{3, 5}, [2]int{4, 6}, [2]int{5, 7}), "stale duplicate"},
		{"missing", seq([2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}, [2]int{3, 4}, [2]int{5, 6}), "never arrived"},
		{"across topics", seq([2]int{0, 1}, [2]int{1, 2}, [2]int{2, 3}, [2]int{3, 4}, [2]int{4, 9}, [2]int{5, 8}), "across topics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{TB: t}
			VerifyDelivery(r, f, evs, tt.got)
			joined := strings.Join(r.errs, "\n")
			if tt.want == "" && len(r.errs) > 0 {
				t.Fatalf("errors for a valid delivery:\n%s", joined)
			}
			if tt.want != "" && !strings.Contains(joined, tt.want) {
				t.Fatalf("errors %q, want one containing %q", joined, tt.want)
			}
		})
	}
}

func header(e Event) string {
	if e.Headers == "" {
		return ""
	}
	i := strings.Index(e.Headers, `"traceparent": "`) + len(`"traceparent": "`)
	return e.Headers[i : i+strings.Index(e.Headers[i:], `"`)]
}
