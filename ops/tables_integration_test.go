package ops

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestInitAndStatusOfSeveralTables: init creates a missing table of the tables list (with
// --create-table, and refuses without), one publication for every table, and adds a table that a
// later configuration lists to the existing publication; status reports every table.
func TestInitAndStatusOfSeveralTables(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	if _, err := f.DB.Exec(ctx, "DROP PUBLICATION "+f.Publication); err != nil {
		t.Fatal(err)
	}
	second := f.Table + "_b"
	t.Cleanup(func() { _, _ = f.DB.Exec(context.Background(), "DROP TABLE IF EXISTS "+second) })
	cfg := config.Default()
	cfg.Postgres.URL, cfg.Postgres.Table, cfg.Postgres.Publication, cfg.Postgres.Slot = f.PostgresURL, f.Table, f.Publication, f.Slot
	cfg.Kafka.Brokers = f.Brokers
	cfg.Kafka.Delivery = config.DeliveryAtLeastOnce
	cfg.Routing.Topic = f.TopicPrefix + ".{event_type}"
	setTables := func(names ...string) {
		var doc strings.Builder
		for _, n := range names {
			doc.WriteString("- table: " + n + "\n  routing: {topic: \"" + f.TopicPrefix + ".b.{event_type}\"}\n")
		}
		cfg.Tables = nil
		if err := yaml.Unmarshal([]byte(doc.String()), &cfg.Tables); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	setTables(second)

	var out bytes.Buffer
	if err := Init(ctx, &out, cfg, InitOptions{}); err == nil || !strings.Contains(err.Error(), second) || !strings.Contains(err.Error(), "--create-table") {
		t.Fatalf("init without --create-table: %v, want a refusal naming %s\n%s", err, second, out.String())
	}
	out.Reset()
	if err := Init(ctx, &out, cfg, InitOptions{CreateTable: true}); err != nil {
		t.Fatalf("init: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "FOR TABLE ") || !strings.Contains(out.String(), strings.TrimPrefix(second, "public.")) {
		t.Errorf("init did not create one publication for both tables:\n%s", out.String())
	}
	st := GatherStatus(ctx, cfg)
	if len(st.Publication.Tables) != 2 || len(st.Tables) != 1 || st.Tables[0].Table != second || !st.Tables[0].Exists {
		t.Fatalf("status: publication tables %v, further tables %+v; want both tables published and %s reported", st.Publication.Tables, st.Tables, second)
	}

	// A third table, listed later: init adds it to the publication that exists.
	g := testenv.NewFixtureIn(t, f)
	setTables(second, g.Table)
	out.Reset()
	if err := Init(ctx, &out, cfg, InitOptions{}); err != nil {
		t.Fatalf("init with a table added to the list: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "ADD TABLE") || !strings.Contains(out.String(), "ok   run's own checks pass") {
		t.Errorf("init did not add the new table to the publication:\n%s", out.String())
	}
	st = GatherStatus(ctx, cfg)
	st.Evaluate(Thresholds{MaxLagBytes: 1 << 30, MaxInactive: time.Hour})
	var text bytes.Buffer
	st.Print(&text)
	if len(st.Publication.Tables) != 3 || len(st.Tables) != 2 || strings.Count(text.String(), "outbox") < 3 {
		t.Errorf("status after the third table: publication tables %v, further tables %d:\n%s", st.Publication.Tables, len(st.Tables), text.String())
	}
}
