// Pruning: the inbox table's rows older than the retention, deleted in the background.

package inbox

import (
	"context"
	"fmt"
	"time"
)

// Prune deletes the claims older than olderThan, in batches of PruneBatch rows (each its own
// statement, so that no long lock is held), and returns how many it deleted. Versions are kept.
func (in *Inbox) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := in.o.DB.Exec(ctx, "DELETE FROM "+in.claims+" WHERE ctid IN (SELECT ctid FROM "+in.claims+
			" WHERE consumer = $1 AND handled_at < now() - make_interval(secs => $2) LIMIT $3)",
			in.o.Consumer, olderThan.Seconds(), in.o.PruneBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		n := tag.RowsAffected()
		total += n
		in.pruned.Add(n)
		in.m.pruned.Add(float64(n))
		if n < int64(in.o.PruneBatch) {
			return total, nil
		}
	}
}

// pruneLoop prunes every PruneInterval until ctx ends.
func (in *Inbox) pruneLoop(ctx context.Context) {
	t := time.NewTicker(in.o.PruneInterval)
	defer t.Stop()
	for {
		if n, err := in.Prune(ctx, in.o.Retention); err != nil {
			if ctx.Err() == nil {
				in.o.Logger.Warn("inbox: prune failed; trying again later", "error", err.Error())
			}
		} else if n > 0 {
			in.o.Logger.Info("inbox: pruned claims", "rows", n, "older_than", in.o.Retention.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
