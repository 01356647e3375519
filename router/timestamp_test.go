package router

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-cdc/outbox-cdc/config"
)

func TestParseStamp(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"2026-12-03T10:00:00.123Z", time.Date(2026, 12, 3, 10, 0, 0, 123e6, time.UTC), true},
		{"2026-12-03T11:00:00.5+01:00", time.Date(2026, 12, 3, 10, 0, 0, 5e8, time.UTC), true},
		{"2026-12-03 10:00:00.123456+00", time.Date(2026, 12, 3, 10, 0, 0, 123456e3, time.UTC), true},
		{"2026-12-03 10:00:00", time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), true},
		{"1764756000123", time.Date(2025, 12, 3, 10, 0, 0, 123e6, time.UTC), true}, // epoch milliseconds
		{"0", time.Time{}, false},
		{"-5", time.Time{}, false},
		{"99999999999999999", time.Time{}, false},
		{"infinity", time.Time{}, false},
		{"0044-03-15 12:00:00+00 BC", time.Time{}, false},
		{"10000-01-01T00:00:00Z", time.Time{}, false},
		{"0001-01-01T00:00:00Z", time.Time{}, false},
		{"yesterday", time.Time{}, false},
		{"", time.Time{}, false},
	} {
		got, ok := parseStamp([]byte(tc.in))
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("parseStamp(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestRecordTime(t *testing.T) {
	commit := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	column := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	withColumn := defaultCols
	withColumn.Timestamp = "stamp"
	for _, tc := range []struct {
		name string
		cols config.Columns
		mode string
		row  mapRow
		src  Source
		want time.Time
	}{
		{"commit", defaultCols, config.RecordTimestampCommit, row("A", "e"), Source{CommitTime: commit}, commit},
		{"produce", defaultCols, config.RecordTimestampProduce, row("A", "e"), Source{CommitTime: commit}, time.Time{}},
		{"no commit time (resync)", defaultCols, config.RecordTimestampCommit, row("A", "e"), Source{}, time.Time{}},
		{"column", withColumn, config.RecordTimestampCommit, mapRow{"stamp": column.Format(time.RFC3339)}, Source{CommitTime: commit}, column},
		{"column over produce", withColumn, config.RecordTimestampProduce, mapRow{"stamp": column.Format(time.RFC3339)}, Source{CommitTime: commit}, column},
		{"column NULL", withColumn, config.RecordTimestampCommit, mapRow{}, Source{CommitTime: commit}, commit},
		{"column unreadable", withColumn, config.RecordTimestampCommit, mapRow{"stamp": "infinity"}, Source{CommitTime: commit}, commit},
		{"column NULL, produce", withColumn, config.RecordTimestampProduce, mapRow{}, Source{CommitTime: commit}, time.Time{}},
	} {
		if got := recordTime(tc.row, tc.cols, tc.mode, tc.src); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestStampLimits(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	read := func(kv ...string) stampLimits {
		var l stampLimits
		for i := 0; i < len(kv); i += 2 {
			l.set(kv[i], kv[i+1])
		}
		return l
	}
	week := "604800000"
	for _, tc := range []struct {
		name string
		l    stampLimits
		t    time.Time
		keep bool
	}{
		{"no limits, old", read(), now.Add(-400 * 24 * time.Hour), true},
		{"recent", read("retention.ms", week, "message.timestamp.after.max.ms", "3600000"), now.Add(-time.Hour), true},
		{"older than half the retention", read("retention.ms", week), now.Add(-4 * 24 * time.Hour), false},
		{"just inside half the retention", read("retention.ms", week), now.Add(-3*24*time.Hour + time.Minute), true},
		{"retention infinite", read("retention.ms", "-1"), now.Add(-400 * 24 * time.Hour), true},
		{"compacted only", read("retention.ms", week, "cleanup.policy", "compact"), now.Add(-30 * 24 * time.Hour), true},
		{"compact and delete", read("retention.ms", week, "cleanup.policy", "compact,delete"), now.Add(-30 * 24 * time.Hour), false},
		{"ahead within after.max", read("message.timestamp.after.max.ms", "3600000"), now.Add(30 * time.Minute), true},
		{"ahead near after.max", read("message.timestamp.after.max.ms", "3600000"), now.Add(59*time.Minute + 30*time.Second), false},
		{"ahead beyond after.max", read("message.timestamp.after.max.ms", "3600000"), now.Add(2 * time.Hour), false},
		{"after.max Long.MAX", read("message.timestamp.after.max.ms", "9223372036854775807"), now.Add(1000 * time.Hour), true},
		{"behind beyond before.max", read("message.timestamp.before.max.ms", "86400000"), now.Add(-25 * time.Hour), false},
		{"difference.max (Kafka 3)", read("message.timestamp.difference.max.ms", "600000"), now.Add(-20 * time.Minute), false},
		{"difference.max ahead", read("message.timestamp.difference.max.ms", "600000"), now.Add(20 * time.Minute), false},
		{"difference.max with a tighter before.max", read("message.timestamp.difference.max.ms", "600000", "message.timestamp.before.max.ms", "60000"), now.Add(-2 * time.Minute), false},
		{"log append time", read("message.timestamp.type", "LogAppendTime", "retention.ms", week), now.Add(-30 * 24 * time.Hour), true},
		{"defaults when unreadable, ahead", defaultStampLimits(), now.Add(2 * time.Hour), false},
		{"defaults when unreadable, recent", defaultStampLimits(), now.Add(-time.Hour), true},
	} {
		got, why := tc.l.fit(tc.t, now)
		if tc.keep && (!got.Equal(tc.t) || why != "") {
			t.Errorf("%s: replaced (%q), want kept", tc.name, why)
		}
		if !tc.keep && (!got.IsZero() || why == "") {
			t.Errorf("%s: kept, want the produce time and a reason", tc.name)
		}
	}
	if got, why := read("retention.ms", week).fit(time.Time{}, now); !got.IsZero() || why != "" {
		t.Errorf("a zero time: %v %q", got, why)
	}
}

// TestStampLimitsNeverKeepWhatTheBrokerRefuses: whatever the limits and the time, a kept timestamp
// lies within the topic's bounds with the margin to spare, and within half its retention.
func TestStampLimitsNeverKeepWhatTheBrokerRefuses(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	rnd := rand.New(rand.NewPCG(1, 2))
	dur := func() time.Duration {
		if rnd.IntN(4) == 0 {
			return 0
		}
		return time.Duration(rnd.Int64N(int64(30 * 24 * time.Hour)))
	}
	for i := 0; i < 100000; i++ {
		l := stampLimits{before: dur(), after: dur(), retention: dur(), compactOnly: rnd.IntN(5) == 0}
		ts := now.Add(time.Duration(rnd.Int64N(int64(60*24*time.Hour))) - 30*24*time.Hour)
		got, why := l.fit(ts, now)
		if got.IsZero() {
			if why == "" {
				t.Fatalf("%+v at %v: replaced without a reason", l, ts)
			}
			continue
		}
		if l.after > 0 && got.After(now.Add(l.after)) || l.before > 0 && got.Before(now.Add(-l.before)) ||
			l.retention > 0 && !l.compactOnly && got.Before(now.Add(-l.retention/2)) {
			t.Fatalf("%+v: kept %v (now %v)", l, got, now)
		}
	}
}

// TestPrepareStampsTheCommitTime: the prepared record carries the commit time, or the column's.
func TestPrepareStampsTheCommitTime(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "A"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	commit := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := testRouter(t, c, nil)
	p, err := r.Prepare(ctx, row("A", "e1"), Source{CommitTime: commit})
	if err != nil {
		t.Fatal(err)
	}
	if !p.rec.Timestamp.Equal(commit) {
		t.Errorf("timestamp %v, want the commit time %v", p.rec.Timestamp, commit)
	}
	r.release(p.size)
	r = testRouter(t, c, func(o *Options) { o.Kafka.RecordTimestamp = config.RecordTimestampProduce })
	if p, err = r.Prepare(ctx, row("A", "e2"), Source{CommitTime: commit}); err != nil {
		t.Fatal(err)
	}
	if !p.rec.Timestamp.IsZero() {
		t.Errorf("timestamp %v, want none (the produce time)", p.rec.Timestamp)
	}
	r.release(p.size)
}
