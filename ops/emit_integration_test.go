package ops

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestInitInstallsOutboxEmit: with postgres.message_prefixes, init installs the function outbox_emit
// in the outbox table's schema with the first prefix, quoted by the server whatever it holds, and a
// second init leaves it alone; the function writes a message an application's role may emit.
func TestInitInstallsOutboxEmit(t *testing.T) {
	f := testenv.NewFixture(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, f.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	var role string
	if err := f.DB.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	schema := strings.TrimPrefix(f.Table, "public.") + "_s"
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	if _, err := f.DB.Exec(ctx, "DROP PUBLICATION "+f.Publication); err != nil {
		t.Fatal(err)
	}
	prefix := `it's "odd"; --`
	cfg := config.Default()
	cfg.Postgres.URL, cfg.Postgres.Table, cfg.Postgres.Publication, cfg.Postgres.Slot = f.PostgresURL, schema+".outbox", f.Publication, f.Slot
	cfg.Postgres.MessagePrefixes = []string{prefix, "second"}
	cfg.Kafka.Brokers = f.Brokers
	cfg.Kafka.Delivery = config.DeliveryAtLeastOnce
	cfg.Routing.Topic = f.TopicPrefix + ".{event_type}"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Init(ctx, &out, cfg, InitOptions{CreateTable: true}); err != nil {
		t.Fatalf("init: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "outbox_emit") {
		t.Errorf("init did not say it created outbox_emit:\n%s", out.String())
	}
	var src string
	if err := f.DB.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'outbox_emit' AND pronamespace = $1::regnamespace", schema).Scan(&src); err != nil {
		t.Fatalf("outbox_emit is not in schema %s: %v", schema, err)
	}
	if !strings.Contains(src, `'it''s "odd"; --'`) {
		t.Errorf("outbox_emit does not emit under the first prefix, quoted:\n%s", src)
	}
	var id string
	if err := f.DB.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "outbox_emit"}.Sanitize()+`('Placed', 'order', '1', '{}')`).Scan(&id); err != nil || len(id) != 36 {
		t.Errorf("outbox_emit returned %q, %v; want an event id", id, err)
	}
	out.Reset()
	if err := Init(ctx, &out, cfg, InitOptions{}); err != nil {
		t.Fatalf("second init: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "outbox_emit") {
		t.Errorf("the second init created outbox_emit again:\n%s", out.String())
	}
}
