// Package readmodel is the example consuming service's logic: a read model of orders kept from the
// events outbox-cdc delivers, applied through package inbox so that each event counts once however
// often Kafka delivers it.
//
// Every event of an order adds its amount and counts itself; the model is deliberately not idempotent
// on its own (a duplicate would count twice), which is what the inbox is for.
package readmodel

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// Model is the read model in one table.
type Model struct {
	// Table is the read model's table (default public.order_totals).
	Table string
}

// table returns the sanitized table name.
func (m Model) table() string {
	if m.Table == "" {
		return `"public"."order_totals"`
	}
	if schema, name, ok := strings.Cut(m.Table, "."); ok {
		return pgx.Identifier{schema, name}.Sanitize()
	}
	return pgx.Identifier{m.Table}.Sanitize()
}

// Setup creates the table if it does not exist.
func (m Model) Setup(ctx context.Context, db inbox.DB) error {
	_, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.table()+` (
		order_id     text   PRIMARY KEY,
		events       bigint NOT NULL,
		amount_cents bigint NOT NULL,
		last_version bigint NOT NULL,
		last_type    text   NOT NULL
	)`)
	if err != nil {
		return fmt.Errorf("readmodel: create the table: %w", err)
	}
	return nil
}

// payload is what the example's order events carry.
type payload struct {
	AmountCents int64 `json:"amount_cents"`
}

// Apply is the inbox handler: it adds the event to its order's row in the inbox's transaction. A
// payload that is not JSON is a permanent failure (the inbox dead-letters it at once).
func (m Model) Apply(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
	var p payload
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		return inbox.Permanent(fmt.Errorf("payload of event %s is not an order event: %w", ev.ID, err))
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+m.table()+` AS t (order_id, events, amount_cents, last_version, last_type) VALUES ($1, 1, $2, $3, $4)
		ON CONFLICT (order_id) DO UPDATE SET events = t.events + 1, amount_cents = t.amount_cents + EXCLUDED.amount_cents,
			last_version = greatest(t.last_version, EXCLUDED.last_version), last_type = EXCLUDED.last_type`,
		ev.AggregateID, p.AmountCents, ev.AggregateVersion, ev.Type)
	if err != nil {
		return fmt.Errorf("readmodel: apply event %s: %w", ev.ID, err)
	}
	return nil
}

// Row is one order of the read model.
type Row struct {
	OrderID                          string
	Events, AmountCents, LastVersion int64
}

// Read returns the read model, keyed by order.
func (m Model) Read(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) (map[string]Row, error) {
	rows, err := db.Query(ctx, "SELECT order_id, events, amount_cents, last_version FROM "+m.table())
	if err != nil {
		return nil, fmt.Errorf("readmodel: read: %w", err)
	}
	out := map[string]Row{}
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.OrderID, &r.Events, &r.AmountCents, &r.LastVersion); err != nil {
			return nil, fmt.Errorf("readmodel: read: %w", err)
		}
		out[r.OrderID] = r
	}
	return out, rows.Err()
}
