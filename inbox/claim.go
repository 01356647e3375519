// Claims: how an event is recorded in the inbox table in the handler's transaction — once per
// event id, and per aggregate only forward when versions are tracked — one at a time or for a batch.

package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// apply claims ev, checks its version and runs the handler in tx, without committing. It returns the
// outcome (duplicate: nothing changed; stale: only the claim, marked stale), or a *handlerFailure
// when the handler failed while the database answered, or another error.
func (in *Inbox) apply(ctx context.Context, tx pgx.Tx, ev Event) (string, error) {
	var c claim
	if err := tx.QueryRow(ctx, in.claimSQL, in.claimArgs(ev)...).Scan(&c.claimed, &c.advanced); err != nil {
		return "", fmt.Errorf("claim: %w", err)
	}
	return in.applyClaimed(ctx, tx, ev, c)
}

// claim is what the claim statement found: whether the event is new to this consumer, and whether
// its version advanced the aggregate's.
type claim struct{ claimed, advanced bool }

// claimStatement is one statement on the claims and versions tables: the claim, and the version only
// when the claim is new, taken only when above the last one applied (no row back means stale).
func claimStatement(claims, versions string) string {
	return `WITH claim AS (
			INSERT INTO ` + claims + ` (consumer, event_id, outcome, topic, partition, "offset") VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT DO NOTHING RETURNING 1
		), version AS (
			INSERT INTO ` + versions + ` AS v (consumer, topic, aggregate_type, aggregate_id, version)
			SELECT $1, $4, $7, $8, $9 WHERE $10::boolean AND EXISTS (SELECT FROM claim)
			ON CONFLICT (consumer, topic, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version WHERE v.version < EXCLUDED.version
			RETURNING 1
		)
		SELECT EXISTS (SELECT FROM claim), EXISTS (SELECT FROM version)`
}

// claimArgs are the claim statement's parameters for ev.
func (in *Inbox) claimArgs(ev Event) []any {
	r := ev.Record
	return []any{in.o.Consumer, ev.ID, OutcomeApplied, r.Topic, r.Partition, r.Offset, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, ev.HasVersion}
}

// applyClaimed goes on from ev's claim in tx: a duplicate is left, a stale event recorded as such,
// a new one handed to the handler.
func (in *Inbox) applyClaimed(ctx context.Context, tx pgx.Tx, ev Event, c claim) (string, error) {
	if !c.claimed {
		return OutcomeDuplicate, nil
	}
	if ev.HasVersion && !c.advanced {
		if _, err := tx.Exec(ctx, "UPDATE "+in.claims+" SET outcome = $3 WHERE consumer = $1 AND event_id = $2", in.o.Consumer, ev.ID, OutcomeStale); err != nil {
			return "", fmt.Errorf("record a stale event: %w", err)
		}
		return OutcomeStale, nil
	}
	if err := in.o.Handler(ctx, tx, ev); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if tx.Conn().IsClosed() {
			return "", fmt.Errorf("the connection died in the handler: %w", err)
		}
		return "", &handlerFailure{err}
	}
	return OutcomeApplied, nil
}

// errDeadLetterStale ends a batch at a stale event that is to be dead-lettered.
var errDeadLetterStale = errors.New("a stale event to dead-letter")

// claimAll runs the claims of evs in tx as one pipelined batch. On failure it returns the index of the
// claim that failed.
func (in *Inbox) claimAll(ctx context.Context, tx pgx.Tx, evs []Event) ([]claim, int, error) {
	b := &pgx.Batch{}
	for _, ev := range evs {
		b.Queue(in.claimSQL, in.claimArgs(ev)...)
	}
	br := tx.SendBatch(ctx, b)
	claims := make([]claim, len(evs))
	for i := range claims {
		if err := br.QueryRow().Scan(&claims[i].claimed, &claims[i].advanced); err != nil {
			_ = br.Close()
			return nil, i, fmt.Errorf("claim: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, len(evs) - 1, fmt.Errorf("claim: %w", err)
	}
	return claims, 0, nil
}
