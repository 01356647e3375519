package router

import (
	"bufio"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The W3C Trace Context headers (https://www.w3.org/TR/trace-context/), as OpenTelemetry's Kafka
// instrumentations read them, and the CloudEvents distributed tracing extension's attributes.
const (
	headerTraceparent   = "traceparent"
	headerTracestate    = "tracestate"
	ceTraceparent       = "ce_traceparent"
	ceTracestate        = "ce_tracestate"
	maxTracestateLength = 512
)

// traceparentRE is a version 00 traceparent: version, trace id, parent (span) id, flags.
var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$`)

// TraceContext is a W3C trace context read from a row.
type TraceContext struct {
	Traceparent, Tracestate string
}

// parseTraceContext reads a trace context column: a traceparent alone, a JSON object with
// traceparent and tracestate members, or Debezium's tracingspancontext column (java.util.Properties
// text: traceparent=... and tracestate=... lines, # comments). An invalid traceparent (wrong form,
// version ff, an all-zero trace or span id) gives none: a broken trace must not break delivery.
func parseTraceContext(v []byte) (TraceContext, bool) {
	s := strings.TrimSpace(string(v))
	var tc TraceContext
	switch {
	case s == "":
		return tc, false
	case strings.HasPrefix(s, "{"):
		var obj map[string]any
		if json.Unmarshal([]byte(s), &obj) != nil {
			return tc, false
		}
		tc.Traceparent, _ = obj[headerTraceparent].(string)
		tc.Tracestate, _ = obj[headerTracestate].(string)
	case strings.Contains(s, "="):
		sc := bufio.NewScanner(strings.NewReader(s))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || line[0] == '#' || line[0] == '!' {
				continue
			}
			k, val, ok := strings.Cut(line, "=")
			if !ok {
				k, val, ok = strings.Cut(line, ":")
			}
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case headerTraceparent:
				tc.Traceparent = strings.TrimSpace(val)
			case headerTracestate:
				tc.Tracestate = strings.ReplaceAll(strings.TrimSpace(val), `\=`, "=")
			}
		}
	default:
		tc.Traceparent = s
	}
	tc.Traceparent = strings.ToLower(strings.TrimSpace(tc.Traceparent))
	m := traceparentRE.FindStringSubmatch(tc.Traceparent)
	if m == nil || strings.HasPrefix(tc.Traceparent, "ff") || strings.Trim(m[1], "0") == "" || strings.Trim(m[2], "0") == "" {
		return TraceContext{}, false
	}
	tc.Tracestate = strings.TrimSpace(tc.Tracestate)
	if len(tc.Tracestate) > maxTracestateLength || strings.ContainsFunc(tc.Tracestate, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		tc.Tracestate = "" // an unusable tracestate is dropped; the trace goes on without it
	}
	return tc, true
}

// addTraceContext sets rec's trace context headers from the row's trace context column (column
// empty: nothing to do): traceparent and tracestate, and in the CloudEvents format the distributed
// tracing extension's ce_traceparent and ce_tracestate too. The column's context replaces one the
// row's headers JSON may have given.
func addTraceContext(rec *kgo.Record, row Row, column string, cloudEvents bool) {
	if column == "" {
		return
	}
	v, ok := row.Value(column)
	if !ok {
		return
	}
	tc, ok := parseTraceContext(v)
	if !ok {
		return
	}
	set := func(key, value string) {
		rec.Headers = slicesDeleteHeader(rec.Headers, key)
		if value != "" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
		}
	}
	set(headerTraceparent, tc.Traceparent)
	set(headerTracestate, tc.Tracestate)
	if cloudEvents {
		set(ceTraceparent, tc.Traceparent)
		set(ceTracestate, tc.Tracestate)
	}
}

// slicesDeleteHeader removes the headers named key.
func slicesDeleteHeader(hs []kgo.RecordHeader, key string) []kgo.RecordHeader {
	out := hs[:0]
	for _, h := range hs {
		if !strings.EqualFold(h.Key, key) {
			out = append(out, h)
		}
	}
	return out
}
