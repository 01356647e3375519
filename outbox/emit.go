package outbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
)

// Event is an outbox event as an application writes it with Emit.
type Event struct {
	// ID is the event's id, which consumers deduplicate on; Emit generates a UUID when it is empty.
	ID string `json:"event_id"`
	// Type routes the event to its topic (routing.topic's {event_type}).
	Type string `json:"event_type"`
	// AggregateType and AggregateID name the entity; AggregateID is the Kafka key.
	AggregateType string `json:"aggregate_type,omitempty"`
	AggregateID   string `json:"aggregate_id"`
	// AggregateVersion, when not zero, is the record's aggregate_version header.
	AggregateVersion int64 `json:"aggregate_version,omitempty"`
	// Payload is the record's value: any JSON value.
	Payload json.RawMessage `json:"payload"`
	// Headers become the record's headers.
	Headers map[string]string `json:"headers,omitempty"`
}

// Emit writes e as a transactional logical decoding message of prefix (postgres.message_prefixes)
// within the transaction exec runs in, and returns its event id: the event is committed, or rolled
// back, with the transaction's business change, and nothing is written to a table. exec is the
// transaction's Exec of pgx (tx.Exec) or of database/sql (tx.ExecContext). The values travel as
// parameters, never spliced into the SQL.
func Emit[R any](ctx context.Context, exec func(ctx context.Context, sql string, args ...any) (R, error), prefix string, e Event) (string, error) {
	if e.Type == "" || e.AggregateID == "" {
		return "", errors.New("outbox: an event needs a Type and an AggregateID")
	}
	if len(e.Payload) == 0 {
		e.Payload = json.RawMessage("null")
	}
	if e.ID == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("outbox: generate an event id: %w", err)
		}
		b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80 // version 4, RFC 4122 variant
		e.ID = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	}
	content, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("outbox: encode event %s: %w", e.ID, err)
	}
	if _, err := exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text)", prefix, string(content)); err != nil {
		return "", fmt.Errorf("outbox: emit event %s: %w", e.ID, err)
	}
	return e.ID, nil
}
