// The outbox verifier: while a session streams, it checks every verifyInterval that the outbox
// table is still published as it was, and lets the slot be confirmed only up to a position an
// earlier check verified.

package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// verifyInterval is how often the outbox's publication is verified while streaming: confirms are
// held at the last verified position, so this bounds how far they trail the watermark.
const verifyInterval = 500 * time.Millisecond

// finalVerifyGap separates the two verifications of a graceful stop: long enough for a commit in
// the WAL before the first to be visible to the second.
const finalVerifyGap = 100 * time.Millisecond

// verifyTimeout bounds one verification.
const verifyTimeout = 5 * time.Second

// verifier checks, every verifyInterval, that the outbox is still published, and keeps the position
// up to which that was seen by a check that a later one confirmed: no status update confirms past it.
// A table dropped, re-created, removed from the publication (even if added back in between), or a
// publication dropped or re-created, stops the session; until the check succeeds again, confirms wait.
type verifier struct {
	target replication.Target
	cat    *replication.Catalog // nil after a failure, until reconnected
	outbox replication.Outbox
	more   []replication.Outbox // the further outbox tables
	log    *slog.Logger
	obs    *observed
	// last is the last successful verification. A change committed just before its position may not
	// have been visible to its catalog check, so confirms go only up to the position of the one
	// before it (limit); every check must continue the last one (the same table, publication and
	// membership rows).
	last  replication.Verification
	limit atomic.Uint64
	// giveUp is how long checks may fail before the session lets go of the replication connection.
	giveUp      time.Duration
	failedSince time.Time // zero while checks succeed
}

// confirmLimit is the stream's ConfirmLimit.
func (v *verifier) confirmLimit() checkpoint.LSN { return checkpoint.LSN(v.limit.Load()) }

// run verifies until ctx ends. An outbox that changed under the stream ends the session through fail;
// so does a server that is shutting down, or checks failing for longer than giveUp: confirms cannot
// move meanwhile, and a walsender at shutdown waits for its client to confirm everything it sent —
// holding on would hold the database.
func (v *verifier) run(ctx context.Context, fail context.CancelCauseFunc) {
	tick := time.NewTicker(verifyInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := v.once(ctx)
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, replication.ErrOutboxChanged):
			fail(err)
			return
		case replication.ShuttingDown(err):
			fail(fmt.Errorf("%w so that PostgreSQL can shut down (the slot keeps everything unconfirmed): %w", errReleased, err))
			return
		default:
			if v.failedSince.IsZero() {
				v.failedSince = time.Now()
				v.log.Warn("cannot verify that the outbox is still published; confirms wait until it can be", "error", err.Error())
			}
			if time.Since(v.failedSince) > v.giveUp {
				fail(fmt.Errorf("%w: the outbox could not be verified for %s: %w", errReleased, v.giveUp, err))
				return
			}
		}
	}
}

// once verifies now, reconnecting first if the last check lost the connection.
func (v *verifier) once(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	if v.cat == nil {
		cat, err := replication.OpenCatalog(ctx, v.target)
		if err != nil {
			return err
		}
		v.cat = cat
	}
	res, err := v.cat.VerifyOutbox(ctx, v.outbox, v.more...)
	if err != nil {
		if !errors.Is(err, replication.ErrOutboxChanged) {
			v.close() // the connection may be broken; the next check opens a new one
		}
		return err
	}
	return v.accept(res)
}

// accept takes a successful check: it must continue the last one, and it moves the confirm limit to
// the last one's position, whose changes this check has certainly seen.
func (v *verifier) accept(res replication.Verification) error {
	if err := res.Continues(v.last, v.outbox, v.more...); err != nil {
		return err
	}
	if !v.failedSince.IsZero() {
		v.log.Info("the outbox is verified again; confirms resume")
		v.failedSince = time.Time{}
	}
	if v.last.LSN > v.confirmLimit() {
		v.limit.Store(uint64(v.last.LSN))
	}
	v.last = res
	v.obs.markVerified(time.Now())
	return nil
}

func (v *verifier) close() {
	if v.cat != nil {
		_ = v.cat.Close(context.Background())
		v.cat = nil
	}
}
