package router

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// stampLimits is what a topic's configuration lets a record's timestamp be, read with its other
// configuration when the router first uses the topic.
type stampLimits struct {
	// logAppend is message.timestamp.type=LogAppendTime: the broker stamps every record itself.
	logAppend bool
	// before and after bound how far a timestamp may lie behind or ahead of the broker's clock
	// (message.timestamp.before.max.ms and after.max.ms, or the older difference.max.ms for both);
	// the broker refuses a batch holding a record outside them. Zero is no bound.
	before, after time.Duration
	// retention is retention.ms with cleanup.policy delete; zero is none. Kafka deletes a segment
	// whose newest timestamp is older than it as soon as the segment rolls, and a segment whose first
	// record is that old rolls at the next write: records stamped that old would be deleted before a
	// lagging consumer reads them.
	retention time.Duration
	// compactOnly is cleanup.policy compact without delete: retention.ms deletes nothing.
	compactOnly bool
}

// defaultStampLimits are Kafka 4's defaults, assumed when a topic's configuration cannot be read:
// nothing more than an hour ahead, seven days of retention.
func defaultStampLimits() stampLimits {
	return stampLimits{after: time.Hour, retention: 7 * 24 * time.Hour}
}

// stampMargin is kept inside a topic's bounds: the broker checks when it appends, which may be a while
// after the router checked (linger, a retry, a broker away).
const stampMargin = time.Minute

// set records one configuration entry of the topic (name and value as DescribeConfigs gives them).
func (l *stampLimits) set(name, value string) {
	ms := func() time.Duration {
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 || n >= int64(1<<63-1)/int64(time.Millisecond) {
			return 0 // unlimited (Long.MAX_VALUE, -1) or unreadable
		}
		return time.Duration(n) * time.Millisecond
	}
	switch name {
	case "message.timestamp.type":
		l.logAppend = value == "LogAppendTime"
	case "message.timestamp.before.max.ms":
		l.before = ms()
	case "message.timestamp.after.max.ms":
		l.after = ms()
	case "message.timestamp.difference.max.ms":
		// Kafka before 4.0: one bound both ways; the newer keys, when the broker has them, are read too
		// and the tighter bound wins in fit.
		if d := ms(); d > 0 {
			l.before, l.after = tighter(l.before, d), tighter(l.after, d)
		}
	case "retention.ms":
		l.retention = ms()
	case "cleanup.policy":
		l.compactOnly = !strings.Contains(value, "delete")
	}
}

// tighter returns the smaller bound of two, zero being none.
func tighter(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// fit returns t when the topic takes it and keeps the record for its retention; otherwise the zero
// time (franz-go then stamps the produce time) and why. A zero t stays zero.
func (l stampLimits) fit(t, now time.Time) (time.Time, string) {
	if t.IsZero() || l.logAppend {
		return t, ""
	}
	switch {
	case l.after > 0 && t.After(now.Add(l.after-min(stampMargin, l.after/2))):
		return time.Time{}, fmt.Sprintf("it lies more than message.timestamp.after.max.ms (%s) ahead of now", l.after)
	case l.before > 0 && t.Before(now.Add(-l.before+min(stampMargin, l.before/2))):
		return time.Time{}, fmt.Sprintf("it lies more than message.timestamp.before.max.ms (%s) behind now", l.before)
	case l.retention > 0 && !l.compactOnly && t.Before(now.Add(-l.retention/2)):
		return time.Time{}, fmt.Sprintf("it is older than half the topic's retention.ms (%s): Kafka could delete the record before consumers read it", l.retention)
	}
	return t, ""
}

// recordTime is a row's Kafka timestamp before the topic's limits: the timestamp column's value
// when postgres.columns.timestamp is set and the value can be read, else the commit time of its
// transaction (kafka.record_timestamp commit), else zero, which franz-go turns into the produce time.
func recordTime(row Row, cols config.Columns, mode string, src Source) time.Time {
	if cols.Timestamp != "" {
		if v, ok := row.Value(cols.Timestamp); ok {
			if t, ok := parseStamp(v); ok {
				return t
			}
		}
	}
	if mode == config.RecordTimestampProduce {
		return time.Time{}
	}
	return src.CommitTime
}

// parseStamp reads a timestamp column's value: an integer is milliseconds since the Unix epoch;
// otherwise a timestamp in RFC 3339 or PostgreSQL's ISO output (how the stream forwards timestamptz
// and timestamp columns, and how a text column would hold one).
func parseStamp(v []byte) (time.Time, bool) {
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		if t := time.UnixMilli(n).UTC(); n > 0 && t.Year() <= 9999 {
			return t, true
		}
		return time.Time{}, false
	}
	for _, layout := range pgTimeLayouts {
		if t, err := time.Parse(layout, string(v)); err == nil {
			if t.Year() < 1970 || t.Year() > 9999 {
				return time.Time{}, false
			}
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}
