package router

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/internal/tracing"
)

// startSpan starts the producer span of rec, a child of the trace context in its headers (the row's
// traceparent), starting at the transaction's commit when known, so that the span shows how long
// the event waited; a recording span's context replaces the record's traceparent, so that the
// consumer's spans are its children.
func (r *Router) startSpan(rec *kgo.Record, src Source) trace.Span {
	carrier := tracing.Headers{Record: rec}
	ctx := tracing.Propagator().Extract(context.Background(), carrier)
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", rec.Topic),
			attribute.String("messaging.message.id", eventID(rec)),
			attribute.String("db.system.name", "postgresql"),
			attribute.String("outbox.source_lsn", src.Position()),
		),
	}
	if len(rec.Key) > 0 {
		opts = append(opts, trace.WithAttributes(attribute.String("messaging.kafka.message.key", string(rec.Key))))
	}
	if !src.CommitTime.IsZero() {
		opts = append(opts, trace.WithTimestamp(src.CommitTime))
	}
	ctx, span := r.opts.Tracer.Start(ctx, "send "+rec.Topic, opts...)
	if span.IsRecording() {
		tracing.Propagator().Inject(ctx, carrier)
	}
	return span
}

// endSpan ends a record's span (nil: none) with its outcome.
func endSpan(span trace.Span, rec *kgo.Record, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String("messaging.destination.partition.id", strconv.Itoa(int(rec.Partition))), attribute.Int64("messaging.kafka.offset", rec.Offset))
	}
	span.End()
}
