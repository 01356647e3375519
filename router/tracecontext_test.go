package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const (
	sampleTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ts       = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

func TestParseTraceContext(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     TraceContext
		ok       bool
	}{
		{"traceparent alone", sampleTP, TraceContext{Traceparent: sampleTP}, true},
		{"upper case and spaces", "  " + "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01 ", TraceContext{Traceparent: sampleTP}, true},
		{"json", `{"traceparent": "` + sampleTP + `", "tracestate": "` + ts + `"}`, TraceContext{sampleTP, ts}, true},
		{"debezium properties", "#Tue Dec 03 10:00:00 UTC 2026\ntraceparent=" + sampleTP + "\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n", TraceContext{sampleTP, ts}, true},
		{"bad tracestate dropped", `{"traceparent": "` + sampleTP + "\", \"tracestate\": \"caf\u00e9\"}", TraceContext{Traceparent: sampleTP}, true},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceContext{}, false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", TraceContext{}, false},
		{"zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", TraceContext{}, false},
		{"short", "00-4bf92f35-00f067aa0ba902b7-01", TraceContext{}, false},
		{"garbage", "hello", TraceContext{}, false},
		{"json without traceparent", `{"tracestate": "a=b"}`, TraceContext{}, false},
		{"empty", "", TraceContext{}, false},
	} {
		got, ok := parseTraceContext([]byte(tc.in))
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTraceContextHeaders(t *testing.T) {
	cols := defaultCols
	cols.TraceContext = "trace"
	row := func(trace string) mapRow {
		r := row("A", "e1")
		r["headers"] = `{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01", "other": "x"}`
		if trace != "" {
			r["trace"] = trace
		}
		return r
	}
	count := func(rec *kgo.Record, key string) int {
		n := 0
		for _, h := range rec.Headers {
			if h.Key == key {
				n++
			}
		}
		return n
	}
	// The column's context replaces the headers JSON's; one of each header.
	rec, err := buildRecord(row(`{"traceparent": "`+sampleTP+`", "tracestate": "`+ts+`"}`), cols, Format{})
	if err != nil {
		t.Fatal(err)
	}
	if header(rec, "traceparent") != sampleTP || header(rec, "tracestate") != ts || count(rec, "traceparent") != 1 || header(rec, "other") != "x" {
		t.Errorf("outbox format: %v", rec.Headers)
	}
	// Without a column value, the headers JSON's stays.
	if rec, _ = buildRecord(row(""), cols, Format{}); header(rec, "traceparent") != "00-11111111111111111111111111111111-2222222222222222-01" {
		t.Errorf("no column value: %v", rec.Headers)
	}
	// CloudEvents: the distributed tracing extension too.
	r := row(sampleTP)
	r["event_type"] = "A"
	if rec, _ = buildRecord(r, cols, Format{CloudEvents: true, Source: "/s"}); header(rec, "ce_traceparent") != sampleTP || header(rec, "traceparent") != sampleTP || count(rec, "ce_tracestate") != 0 {
		t.Errorf("cloudevents: %v", rec.Headers)
	}
	// Debezium's column format, in the debezium format.
	dcols := cols
	dcols.EventID, dcols.AggregateID, dcols.Payload = "event_id", "aggregate_id", "payload"
	if rec, _ = buildRecord(row("traceparent="+sampleTP+"\n"), dcols, Format{Debezium: &DebeziumFormat{}}); header(rec, "traceparent") != sampleTP || header(rec, "id") != "e1" {
		t.Errorf("debezium: %v", rec.Headers)
	}
}

// TestProducerSpans: with a tracer, each record gets a producer span, child of the row's trace
// context and starting at the commit time; the record's traceparent carries the span on (so that
// the consumer's spans are its children); the span ends at the acknowledgement with the partition
// and offset.
func TestProducerSpans(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "A"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	cols := defaultCols
	cols.TraceContext = "trace"
	r := testRouter(t, c, func(o *Options) { o.Tracer = tp.Tracer("test"); o.Columns = cols })
	commit := time.Now().Add(-time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acked := make(chan struct{}, 2)
	for i, tc := range []string{sampleTP, ""} {
		row := row("A", fmt.Sprintf("e%d", i))
		if tc != "" {
			row["trace"] = tc
		}
		p, err := r.Prepare(ctx, row, Source{LSN: 0x16B374D848, CommitTime: commit})
		if err != nil {
			t.Fatal(err)
		}
		r.Produce(p, func() { acked <- struct{}{} })
	}
	for range 2 {
		select {
		case <-acked:
		case <-ctx.Done():
			t.Fatal("not acknowledged")
		}
	}
	ended := rec.Ended()
	// The row without a context starts no trace (sample ratio 0); the sampled one is followed.
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	s := ended[0]
	if s.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent().SpanID().String() != "00f067aa0ba902b7" ||
		s.SpanKind() != trace.SpanKindProducer || !s.StartTime().Equal(commit) || s.Name() != "send A" {
		t.Errorf("span %s parent %s kind %v start %v", s.Name(), s.Parent().SpanID(), s.SpanKind(), s.StartTime())
	}
	attrs := map[string]string{}
	for _, a := range s.Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["messaging.destination.name"] != "A" || attrs["messaging.message.id"] != "e0" || attrs["messaging.kafka.offset"] == "" || attrs["outbox.source_lsn"] != "16/B374D848" {
		t.Errorf("attributes %v", attrs)
	}
	// What Kafka holds carries the producer span's context.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("A"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]string{}
	for len(got) < 2 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[header(r, "event_id")] = header(r, "traceparent") })
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + s.SpanContext().SpanID().String() + "-01"
	if got["e0"] != want || got["e1"] != "" {
		t.Errorf("traceparent headers %v, want e0: %s and e1: none", got, want)
	}
}
