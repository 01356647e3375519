package ops

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestStatusCountsRowsTheStatisticsDoNotKnow: a table that was never analyzed holds rows that
// pg_class does not count; status counts them, says nothing of an oldest row while the table is empty,
// and its JSON has lists where lists are expected, never null.
func TestStatusCountsRowsTheStatisticsDoNotKnow(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	cfg := config.Default()
	cfg.Postgres.URL, cfg.Postgres.Table, cfg.Postgres.Publication, cfg.Postgres.Slot = f.PostgresURL, f.Table, f.Publication, f.Slot
	cfg.Kafka.Brokers = f.Brokers
	cat, err := replication.OpenCatalog(ctx, replication.Target{URL: f.PostgresURL})
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close(ctx)
	st, err := cat.OutboxState(ctx, outboxOf(cfg), "created_at")
	if err != nil {
		t.Fatal(err)
	}
	if st.RowEstimate != 0 || st.OldestAgeSeconds != nil {
		t.Fatalf("empty table: %+v, want 0 rows and no oldest row", st)
	}
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{testenv.NewGenerator(1, "A").Event(0), testenv.NewGenerator(1, "A").Event(0), testenv.NewGenerator(1, "A").Event(0)}, false); err != nil {
		t.Fatal(err)
	}
	st, err = cat.OutboxState(ctx, outboxOf(cfg), "created_at")
	if err != nil {
		t.Fatal(err)
	}
	if st.RowEstimate != 3 || st.RowsAtLeast || st.OldestAgeSeconds == nil || *st.OldestAgeSeconds > 60 {
		t.Fatalf("three rows never analyzed: %+v", st)
	}
	full := GatherStatus(ctx, cfg)
	full.Evaluate(Thresholds{MaxLagBytes: 1 << 30, MaxInactive: time.Hour})
	var out bytes.Buffer
	if err := full.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"problems"`, `"topics_present"`, `"topics_missing"`, `"tables"`} {
		if i := strings.Index(out.String(), key+": null"); i >= 0 {
			t.Errorf("status --json has %s: null:\n%s", key, out.String())
		}
	}
	var text bytes.Buffer
	full.Print(&text)
	if !regexp.MustCompile(`(?m)^\s+rows\s+3$`).MatchString(text.String()) {
		t.Errorf("status text does not say the table holds 3 rows:\n%s", text.String())
	}
}

// TestStatusNamesTheHostConnectedTo: with a multi-host postgres.url whose first host does not
// answer, status names every host as the target and the one that answered as the server.
func TestStatusNamesTheHostConnectedTo(t *testing.T) {
	f := testenv.NewFixture(t)
	cfg := testenv.RouterConfig(f)
	var real string
	cfg.Postgres.URL, real = testenv.DeadHostFirst(cfg.Postgres.URL)
	st := GatherStatus(context.Background(), cfg)
	if !st.Postgres.Reachable || st.Postgres.Server != real || !strings.Contains(st.Postgres.Target, "127.0.0.1:1,"+real) {
		t.Fatalf("status of a multi-host URL: %+v, want the target naming both hosts and the server %s", st.Postgres, real)
	}
	var out bytes.Buffer
	st.Print(&out)
	if !strings.Contains(out.String(), "(connected to "+real+")") {
		t.Errorf("status text does not name the host connected to:\n%s", out.String())
	}
}
