// Batches: the records of one fetch handled in one database transaction, and the fall-back to one
// at a time from the record that failed.

package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// handleBatch applies recs (one partition's, in order) in one transaction. When anything fails —
// an event's handler, a statement, the commit — it rolls the batch back and handles the events up to
// the failed one each on its own (handle: retries, dead letters), then batches the rest again. It
// returns an error only when an event can be neither applied nor dead-lettered.
func (in *Inbox) handleBatch(ctx context.Context, recs []*kgo.Record) error {
	if in.o.BatchSize == 1 {
		for _, r := range recs {
			if err := in.handle(ctx, r); err != nil {
				return err
			}
		}
		return nil
	}
	for len(recs) > 0 {
		n := min(len(recs), in.o.BatchSize)
		failedAt, err := in.tryBatch(ctx, recs[:n])
		if err == nil {
			recs = recs[n:]
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, r := range recs[:failedAt] {
			if err := in.handle(ctx, r); err != nil {
				return err
			}
		}
		var hf *handlerFailure
		if !errors.As(err, &hf) {
			hf = nil
		}
		if err := in.handleAfter(ctx, recs[failedAt], hf); err != nil {
			return err
		}
		recs = recs[failedAt+1:]
	}
	return nil
}

// tryBatch applies recs in one transaction and commits it; on failure it returns the index of the
// record at fault (the last one for a failed commit) and the error, with the batch rolled back.
func (in *Inbox) tryBatch(ctx context.Context, recs []*kgo.Record) (failedAt int, err error) {
	tx, err := in.o.DB.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	evs := make([]Event, len(recs))
	outcomes := make([]string, len(recs))
	start := time.Now()
	for i, r := range recs {
		evs[i] = eventOf(r)
		if evs[i].ID == "" {
			return i, errors.New("no event id") // handle dead-letters it
		}
	}
	// The claims of the whole batch in one round trip: they run in order in tx, so a duplicate or an
	// older version later in the batch sees the claims before it, as one by one.
	claims, failedAt, err := in.claimAll(ctx, tx, evs)
	if err != nil {
		return failedAt, err
	}
	for i := range evs {
		if outcomes[i], err = in.applyClaimed(ctx, tx, evs[i], claims[i]); err != nil {
			return i, err // a handler failure is counted once, when handleBatch goes on from it
		}
		if outcomes[i] == OutcomeStale && in.o.Stale == DeadLetterStale {
			// Its dead letter is written before its claim is recorded: handled on its own.
			return i, errDeadLetterStale
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return len(recs) - 1, fmt.Errorf("commit: %w", err)
	}
	took := time.Since(start) / time.Duration(len(recs))
	for _, outcome := range outcomes {
		in.count(outcome, took)
	}
	return 0, nil
}
