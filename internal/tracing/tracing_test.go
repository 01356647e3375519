package tracing

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// TestSpansReachTheCollector: spans go to <endpoint>/v1/traces in OTLP's JSON encoding, which the
// protocol's own protobuf definitions read back (protojson): ids, parent, kind, times, attributes,
// status and resource as recorded.
func TestSpansReachTheCollector(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "wrong path or type", http.StatusBadRequest)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
	}))
	defer srv.Close()
	tracer, stop, err := Setup(context.Background(), config.Tracing{OTLPEndpoint: srv.URL, ServiceName: "svc", SampleRatio: 1}, "v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	// A parent from a row's traceparent.
	rec := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}}
	ctx := Propagator().Extract(context.Background(), Headers{Record: rec})
	_, span := tracer.Start(ctx, "send orders", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.destination.name", "orders"), attribute.Int64("messaging.kafka.offset", 42), attribute.Bool("b", true)))
	span.SetStatus(codes.Error, "refused")
	span.End()
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 {
		t.Fatalf("%d requests", len(bodies))
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := protojson.Unmarshal(bodies[0], &req); err != nil {
		t.Fatalf("the collector could not read the request: %v\n%s", err, bodies[0])
	}
	rs := req.GetResourceSpans()
	if len(rs) != 1 || len(rs[0].GetScopeSpans()) != 1 || len(rs[0].GetScopeSpans()[0].GetSpans()) != 1 {
		t.Fatalf("request %s", bodies[0])
	}
	res := map[string]string{}
	for _, kv := range rs[0].GetResource().GetAttributes() {
		res[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	if res["service.name"] != "svc" || res["service.version"] != "v1.2.3" {
		t.Errorf("resource %v", res)
	}
	s := rs[0].GetScopeSpans()[0].GetSpans()[0]
	// OTLP's JSON writes ids in hexadecimal, not base64 as protobuf's JSON mapping would (so
	// protojson reads them wrongly): they are checked in the raw request.
	var raw struct {
		ResourceSpans []struct {
			ScopeSpans []struct {
				Spans []struct{ TraceID, SpanID, ParentSpanID string }
			}
		}
	}
	if err := json.Unmarshal(bodies[0], &raw); err != nil {
		t.Fatal(err)
	}
	ids := raw.ResourceSpans[0].ScopeSpans[0].Spans[0]
	if sc := span.SpanContext(); ids.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || ids.SpanID != sc.SpanID().String() || ids.ParentSpanID != "00f067aa0ba902b7" {
		t.Errorf("ids %+v, span %s", ids, sc.SpanID())
	}
	if s.GetName() != "send orders" || s.GetKind().String() != "SPAN_KIND_PRODUCER" || s.GetStatus().GetCode().String() != "STATUS_CODE_ERROR" ||
		s.GetStatus().GetMessage() != "refused" || s.GetEndTimeUnixNano() < s.GetStartTimeUnixNano() || s.GetStartTimeUnixNano() == 0 {
		t.Errorf("span %v", s)
	}
	attrs := map[string]string{}
	for _, kv := range s.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().String()
	}
	if len(attrs) != 3 || attrs["messaging.kafka.offset"] != "int_value:42" || attrs["b"] != "bool_value:true" {
		t.Errorf("attributes %v", attrs)
	}
}

func TestTracingOff(t *testing.T) {
	tracer, stop, err := Setup(context.Background(), config.Tracing{}, "v")
	if err != nil || tracer != nil || stop(context.Background()) != nil {
		t.Fatalf("off: %v %v", tracer, err)
	}
}
