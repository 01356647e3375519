package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// event is one outbox row written by a test.
type event struct {
	ID       string
	Type     string
	AggType  string
	AggID    string
	Version  int64
	Payload  string
	Headers  string // JSON object or ""
	TxNumber int
}

// generator hands out events with per-aggregate increasing versions.
type generator struct {
	types    []string
	aggs     int
	versions map[string]int64
	next     int
}

func newGenerator(aggs int, types ...string) *generator {
	return &generator{types: types, aggs: aggs, versions: map[string]int64{}}
}

func (g *generator) event(pick int) event {
	g.next++
	agg := fmt.Sprintf("agg-%d", pick%g.aggs)
	g.versions[agg]++
	return event{
		ID:      newUUID(),
		Type:    g.types[g.next%len(g.types)],
		AggType: "order",
		AggID:   agg,
		Version: g.versions[agg],
		Payload: fmt.Sprintf(`{"n": %d, "agg": %q}`, g.next, agg),
		Headers: fmt.Sprintf(`{"traceparent": "00-%032x-%016x-01", "attempt": 1}`, g.next, g.next),
	}
}

// insertTx writes events in one transaction; with deleteAfter the rows are deleted in the same
// transaction, the way applications keep the outbox empty.
func insertTx(ctx context.Context, db *pgx.Conn, table string, evs []event, deleteAfter bool) error {
	ids := make([]string, len(evs))
	types := make([]string, len(evs))
	aggTypes := make([]string, len(evs))
	aggIDs := make([]string, len(evs))
	versions := make([]int64, len(evs))
	payloads := make([]string, len(evs))
	headers := make([]*string, len(evs))
	for i, e := range evs {
		ids[i], types[i], aggTypes[i], aggIDs[i], versions[i], payloads[i] = e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload
		if e.Headers != "" {
			h := e.Headers
			headers[i] = &h
		}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::jsonb[], $7::jsonb[])`,
		ids, types, aggTypes, aggIDs, versions, payloads, headers)
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	if deleteAfter {
		if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE event_id = ANY($1::uuid[])`, ids); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return tx.Commit(ctx)
}

// testConfig is the pipeline configuration for a fixture, with short intervals for tests.
func testConfig(f *testenv.Fixture) config.Config {
	cfg := config.Default()
	cfg.Postgres.URL = f.PostgresURL
	cfg.Postgres.Table = f.Table
	cfg.Postgres.Slot = f.Slot
	cfg.Postgres.Publication = f.Publication
	cfg.Postgres.StatusInterval = 2 * time.Second
	cfg.Postgres.StandbyPollInterval = 500 * time.Millisecond
	cfg.Kafka.Brokers = f.Brokers
	cfg.Kafka.TopicPartitions = 3
	cfg.Routing.Topic = f.TopicPrefix + ".{event_type}"
	cfg.ShutdownTimeout = 20 * time.Second
	return cfg
}

// testLogger logs to the test output when -v is given and stays quiet otherwise.
func testLogger(t testing.TB) *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// running is a pipeline running in the background of a test.
type running struct {
	p    *Pipeline
	stop func() error
}

// startPipeline runs a pipeline until the test stops it or ends.
func startPipeline(t *testing.T, cfg config.Config) *running {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	p, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	var result error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(60 * time.Second):
				result = errors.New("pipeline did not stop within 60 s")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	waitFor(t, 60*time.Second, "pipeline streaming", func() bool { return p.State() == StateStreaming })
	return &running{p: p, stop: stop}
}

// topicsOf returns the topics the fixture's events route to.
func topicsOf(f *testenv.Fixture, types ...string) []string {
	out := make([]string, len(types))
	for i, ty := range types {
		out[i] = f.TopicPrefix + "." + ty
	}
	return out
}

// verifyDelivery checks that every event arrived on its topic with the right key, value and headers,
// and that per topic and key the first occurrences are in version order. It returns the number of
// duplicate deliveries.
func verifyDelivery(t *testing.T, f *testenv.Fixture, want []event, got []*kgo.Record) (duplicates int) {
	t.Helper()
	byID := make(map[string]event, len(want))
	for _, e := range want {
		byID[e.ID] = e
	}
	seen := make(map[string]bool, len(want))
	// Records of one partition arrive in offset order from the consumer; sort to be sure.
	sort.SliceStable(got, func(i, j int) bool {
		if got[i].Topic != got[j].Topic {
			return got[i].Topic < got[j].Topic
		}
		if got[i].Partition != got[j].Partition {
			return got[i].Partition < got[j].Partition
		}
		return got[i].Offset < got[j].Offset
	})
	lastVersion := map[string]int64{} // topic|key -> version
	for _, r := range got {
		id := testenv.Header(r, "event_id")
		e, ok := byID[id]
		if !ok {
			t.Errorf("unexpected record on %s with event_id %q", r.Topic, id)
			continue
		}
		if seen[id] {
			duplicates++
			continue
		}
		seen[id] = true
		if wantTopic := f.TopicPrefix + "." + e.Type; r.Topic != wantTopic {
			t.Errorf("event %s on topic %s, want %s", id, r.Topic, wantTopic)
		}
		if string(r.Key) != e.AggID {
			t.Errorf("event %s key %q, want %q", id, r.Key, e.AggID)
		}
		if !sameJSON(r.Value, []byte(e.Payload)) {
			t.Errorf("event %s value %s, want %s", id, r.Value, e.Payload)
		}
		if h := testenv.Header(r, "event_type"); h != e.Type {
			t.Errorf("event %s header event_type %q, want %q", id, h, e.Type)
		}
		if h := testenv.Header(r, "aggregate_type"); h != e.AggType {
			t.Errorf("event %s header aggregate_type %q, want %q", id, h, e.AggType)
		}
		if h := testenv.Header(r, "aggregate_version"); h != fmt.Sprint(e.Version) {
			t.Errorf("event %s header aggregate_version %q, want %d", id, h, e.Version)
		}
		if h := testenv.Header(r, "created_at"); !strings.HasSuffix(h, "Z") {
			t.Errorf("event %s header created_at %q is not RFC 3339 UTC", id, h)
		}
		if e.Headers != "" {
			var hs map[string]any
			_ = json.Unmarshal([]byte(e.Headers), &hs)
			if tp, _ := hs["traceparent"].(string); testenv.Header(r, "traceparent") != tp {
				t.Errorf("event %s header traceparent %q, want %q", id, testenv.Header(r, "traceparent"), tp)
			}
		}
		k := r.Topic + "|" + string(r.Key)
		if e.Version <= lastVersion[k] {
			t.Errorf("per-aggregate order broken on %s key %s: version %d after %d", r.Topic, r.Key, e.Version, lastVersion[k])
		}
		lastVersion[k] = e.Version
	}
	missing := 0
	for _, e := range want {
		if !seen[e.ID] {
			missing++
			if missing <= 5 {
				t.Errorf("event %s (%s, %s v%d) never arrived", e.ID, e.Type, e.AggID, e.Version)
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d events missing", missing, len(want))
	}
	return duplicates
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
