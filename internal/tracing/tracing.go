// Package tracing sets up OpenTelemetry tracing for outbox-cdc: a tracer (the OpenTelemetry Go SDK)
// whose spans go to an OTLP/HTTP collector, and the W3C trace context carried in Kafka record
// headers. Off unless tracing.otlp_endpoint is set.
package tracing

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// Setup returns the tracer of the configuration's tracing section and the function that flushes
// and stops it; a nil tracer when tracing is off. Spans are sampled after their parent (a row's
// sampled trace context is always followed) and, for rows without one, at tracing.sample_ratio.
func Setup(_ context.Context, c config.Tracing, version string) (trace.Tracer, func(context.Context) error, error) {
	if c.OTLPEndpoint == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp := newJSONExporter(c.OTLPEndpoint)
	res := resource.NewSchemaless(attribute.String("service.name", c.ServiceName), attribute.String("service.version", version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
	)
	return tp.Tracer("github.com/outbox-cdc/outbox-cdc"), tp.Shutdown, nil
}

// Headers is a propagation.TextMapCarrier over a Kafka record's headers.
type Headers struct{ Record *kgo.Record }

// Get returns the value of the first header named key.
func (h Headers) Get(key string) string {
	for _, hd := range h.Record.Headers {
		if hd.Key == key {
			return string(hd.Value)
		}
	}
	return ""
}

// Set replaces every header named key with one of the value.
func (h Headers) Set(key, value string) {
	hs := h.Record.Headers[:0]
	for _, hd := range h.Record.Headers {
		if hd.Key != key {
			hs = append(hs, hd)
		}
	}
	h.Record.Headers = append(hs, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

// Keys lists the header names.
func (h Headers) Keys() []string {
	keys := make([]string, 0, len(h.Record.Headers))
	for _, hd := range h.Record.Headers {
		keys = append(keys, hd.Key)
	}
	return keys
}

// Propagator is the W3C trace context propagator (traceparent, tracestate).
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }
