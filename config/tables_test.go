package config

import (
	"strings"
	"testing"
)

func TestTablesShareTheSourceWithTheirOwnRouting(t *testing.T) {
	cfg, err := loadYAML(t, `
kafka:
  brokers: ["127.0.0.1:59092"]
sources:
  - name: s6
    postgres: {url: "postgres://u@127.0.0.1:55432/db6", table: public.outbox, slot: s6, publication: pub6}
    routing: {topic: "orders.{event_type}", topics: {order.cancelled: orders.cancelled}, dlq_topic: dlq6}
    tables:
      - table: billing.outbox
        routing: {topic: "billing.{event_type}", topics: {invoice.voided: billing.voided}}
      - table: outbox_c
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.Source("s6")
	if err != nil {
		t.Fatal(err)
	}
	tables, err := s.OutboxTables()
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"count", len(tables), 3},
		{"first is postgres.table", tables[0].Table, "public.outbox"},
		{"first has the source's routing", tables[0].Routing.Topic, "orders.{event_type}"},
		{"second's own template", tables[1].Routing.Topic, "billing.{event_type}"},
		{"second's topics add to the source's", tables[1].Routing.Topics, map[string]string{"order.cancelled": "orders.cancelled", "invoice.voided": "billing.voided"}},
		{"the source's topics are not the table's", s.Routing.Topics, map[string]string{"order.cancelled": "orders.cancelled"}},
		{"dead letters are the source's", tables[1].Routing.DLQTopic, "dlq6"},
		{"third inherits the routing", tables[2].Routing.Topic, "orders.{event_type}"},
		{"third's name as written", tables[2].Table, "outbox_c"},
	}
	for _, c := range checks {
		if !equalAny(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	// The one-source shorthand takes a tables list too.
	one, err := loadYAML(t, `
postgres: {url: "postgres://u@127.0.0.1:55432/db6"}
kafka: {brokers: ["127.0.0.1:59092"]}
tables: [{table: public.outbox_b, routing: {topic: b}}]
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tables, err := one.OutboxTables(); err != nil || len(tables) != 2 || tables[1].Routing.Topic != "b" {
		t.Errorf("shorthand: %+v, %v", tables, err)
	}
}

func TestTablesValidation(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"postgres.table again", `tables: [{table: outbox}]`, []string{"tables[0].table: outbox is also postgres.table"}},
		{"listed twice", `tables: [{table: a.b}, {table: a.b}]`, []string{"tables[1].table: a.b is also tables[0].table"}},
		{"not a table", `tables: [{table: a.b.c}]`, []string{"tables[0].table: must be table or schema.table"}},
		{"no table", `tables: [{routing: {topic: x}}]`, []string{"tables[0].table: must be table or schema.table"}},
		{"own dead letters", `tables: [{table: b, routing: {dlq_topic: mine}}]`, []string{"tables[0].routing.dlq_topic: a table cannot have a dead-letter topic of its own"}},
		{"unknown routing key", `tables: [{table: b, routing: {topicz: x}}]`, []string{"tables[0].routing", "topicz"}},
		{"unknown entry key", `tables: [{table: b, slot: x}]`, []string{"slot cannot be set per table"}},
		{"checkpoint topic", "kafka: {brokers: [\"h:1\"], delivery: exactly-once, checkpoint_topic: cp}\ntables: [{table: b, routing: {fallback_topic: cp}}]",
			[]string{"tables[0].routing: routes to kafka.checkpoint_topic"}},
		{"no route", "routing: {topic: \"\", fallback_topic: \"\", topics: {a: b}}\ntables: [{table: b, routing: {}}]", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := "postgres: {url: \"postgres://u@127.0.0.1:55432/db6\"}\n"
			if !strings.Contains(c.doc, "kafka:") {
				doc += "kafka: {brokers: [\"127.0.0.1:59092\"]}\n"
			}
			_, err := loadYAML(t, doc+c.doc, nil)
			if c.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// Across sources: a table of one source that is another's on the same database.
	_, err := loadYAML(t, `
kafka: {brokers: ["127.0.0.1:59092"]}
sources:
  - {name: a, postgres: {url: "postgres://u@h:1/db", slot: a, publication: pa}, tables: [{table: public.outbox_b}]}
  - {name: b, postgres: {url: "postgres://u@h:1/db", table: outbox_b, slot: b, publication: pb}}
`, nil)
	if err == nil || !strings.Contains(err.Error(), "sources[1] (b): postgres.table: outbox_b is also a table of source a") {
		t.Errorf("clash across sources: %v", err)
	}
}
