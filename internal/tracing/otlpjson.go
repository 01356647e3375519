package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// jsonExporter sends spans to an OTLP/HTTP collector in OTLP's JSON encoding (POST <endpoint>/v1/traces,
// application/json). The SDK's own OTLP exporter speaks protobuf and links gRPC, which would add
// about 13 MB to a 27 MB binary; the JSON encoding is part of the same stable protocol, and the test
// reads what this writes back with the protocol's own protobuf definitions.
type jsonExporter struct {
	url    string
	client *http.Client
}

// newJSONExporter returns the exporter for an OTLP/HTTP endpoint (scheme, host, port, and a base
// path if the collector has one).
func newJSONExporter(endpoint string) *jsonExporter {
	return &jsonExporter{url: strings.TrimSuffix(endpoint, "/") + "/v1/traces", client: &http.Client{Timeout: 10 * time.Second}}
}

// The OTLP JSON encoding of ExportTraceServiceRequest
// (opentelemetry-proto, trace/v1 and collector/trace/v1): trace and span ids in hexadecimal,
// 64-bit integers as decimal strings, enums as integers.
type (
	otlpRequest struct {
		ResourceSpans []otlpResourceSpans `json:"resourceSpans"`
	}
	otlpResourceSpans struct {
		Resource   otlpResource     `json:"resource"`
		ScopeSpans []otlpScopeSpans `json:"scopeSpans"`
	}
	otlpResource struct {
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpScopeSpans struct {
		Scope otlpScope  `json:"scope"`
		Spans []otlpSpan `json:"spans"`
	}
	otlpScope struct {
		Name    string `json:"name"`
		Version string `json:"version,omitempty"`
	}
	otlpSpan struct {
		TraceID           string         `json:"traceId"`
		SpanID            string         `json:"spanId"`
		TraceState        string         `json:"traceState,omitempty"`
		ParentSpanID      string         `json:"parentSpanId,omitempty"`
		Flags             uint32         `json:"flags,omitempty"`
		Name              string         `json:"name"`
		Kind              int            `json:"kind"`
		StartTimeUnixNano string         `json:"startTimeUnixNano"`
		EndTimeUnixNano   string         `json:"endTimeUnixNano"`
		Attributes        []otlpKeyValue `json:"attributes,omitempty"`
		Events            []otlpEvent    `json:"events,omitempty"`
		Status            *otlpStatus    `json:"status,omitempty"`
	}
	otlpEvent struct {
		TimeUnixNano string         `json:"timeUnixNano"`
		Name         string         `json:"name"`
		Attributes   []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpStatus struct {
		Message string `json:"message,omitempty"`
		Code    int    `json:"code"`
	}
	otlpKeyValue struct {
		Key   string       `json:"key"`
		Value otlpAnyValue `json:"value"`
	}
	otlpAnyValue struct {
		StringValue *string  `json:"stringValue,omitempty"`
		BoolValue   *bool    `json:"boolValue,omitempty"`
		IntValue    *string  `json:"intValue,omitempty"`
		DoubleValue *float64 `json:"doubleValue,omitempty"`
	}
)

// keyValues encodes attributes; slices are written as their string form.
func keyValues(attrs []attribute.KeyValue) []otlpKeyValue {
	out := make([]otlpKeyValue, 0, len(attrs))
	for _, a := range attrs {
		var v otlpAnyValue
		switch a.Value.Type() {
		case attribute.BOOL:
			b := a.Value.AsBool()
			v.BoolValue = &b
		case attribute.INT64:
			s := strconv.FormatInt(a.Value.AsInt64(), 10)
			v.IntValue = &s
		case attribute.FLOAT64:
			f := a.Value.AsFloat64()
			v.DoubleValue = &f
		default:
			s := a.Value.Emit()
			v.StringValue = &s
		}
		out = append(out, otlpKeyValue{Key: string(a.Key), Value: v})
	}
	return out
}

func unixNano(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// encode builds the request for spans, grouped by resource and instrumentation scope.
func encode(spans []sdktrace.ReadOnlySpan) otlpRequest {
	var req otlpRequest
	resources := map[string]int{} // encoded resource -> index in ResourceSpans
	scopes := map[string][2]int{} // resource and scope -> indexes
	for _, s := range spans {
		res := ""
		if s.Resource() != nil {
			res = s.Resource().Encoded(attribute.DefaultEncoder())
		}
		rs, ok := resources[res]
		if !ok {
			var attrs []otlpKeyValue
			if s.Resource() != nil {
				attrs = keyValues(s.Resource().Attributes())
			}
			req.ResourceSpans = append(req.ResourceSpans, otlpResourceSpans{Resource: otlpResource{Attributes: attrs}})
			rs = len(req.ResourceSpans) - 1
			resources[res] = rs
		}
		scope := s.InstrumentationScope()
		k := res + "\x00" + scope.Name + "\x00" + scope.Version
		idx, ok := scopes[k]
		if !ok {
			req.ResourceSpans[rs].ScopeSpans = append(req.ResourceSpans[rs].ScopeSpans, otlpScopeSpans{Scope: otlpScope{Name: scope.Name, Version: scope.Version}})
			idx = [2]int{rs, len(req.ResourceSpans[rs].ScopeSpans) - 1}
			scopes[k] = idx
		}
		sc := s.SpanContext()
		span := otlpSpan{
			TraceID: sc.TraceID().String(), SpanID: sc.SpanID().String(), TraceState: sc.TraceState().String(),
			Flags: uint32(sc.TraceFlags()), Name: s.Name(), Kind: int(s.SpanKind()),
			StartTimeUnixNano: unixNano(s.StartTime()), EndTimeUnixNano: unixNano(s.EndTime()), Attributes: keyValues(s.Attributes()),
		}
		if p := s.Parent(); p.IsValid() {
			span.ParentSpanID = p.SpanID().String()
		}
		for _, e := range s.Events() {
			span.Events = append(span.Events, otlpEvent{TimeUnixNano: unixNano(e.Time), Name: e.Name, Attributes: keyValues(e.Attributes)})
		}
		switch s.Status().Code {
		case codes.Error:
			span.Status = &otlpStatus{Code: 2, Message: s.Status().Description}
		case codes.Ok:
			span.Status = &otlpStatus{Code: 1}
		}
		ss := &req.ResourceSpans[idx[0]].ScopeSpans[idx[1]]
		ss.Spans = append(ss.Spans, span)
	}
	return req
}

// ExportSpans posts spans to the collector.
func (e *jsonExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body, err := json.Marshal(encode(spans))
	if err != nil {
		return fmt.Errorf("encode spans: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("export spans: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("export spans to %s: %w", e.url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("export spans to %s: %s: %s", e.url, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// Shutdown implements sdktrace.SpanExporter.
func (e *jsonExporter) Shutdown(context.Context) error { return nil }
