// The writers: transactions of events as rows (some deleted again) or WAL messages, and the ledger of
// what committed, looked up by transaction id where a commit's outcome is unknown.

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// write commits transactions of one to five events at the writer's share of the rate, deleting the
// rows in the same transaction half of the time, until ctx ends. Only what was seen committed (or
// found committed after an unknown outcome) is recorded.
func (s *suite) write(ctx context.Context, w int) {
	gen := testenv.NewGenerator(20, "OrderPlaced", "OrderPaid").WithPrefix(fmt.Sprintf("w%d-", w))
	var db *pgx.Conn
	defer func() {
		if db != nil {
			_ = db.Close(context.Background())
		}
	}()
	pause := time.Duration(float64(time.Second) * 3 / (float64(s.o.rate) / 2))
	for i := 0; ctx.Err() == nil; i++ {
		if db == nil || db.IsClosed() {
			c, err := pgx.Connect(ctx, s.pgURL)
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			db = c
		}
		evs := make([]testenv.Event, 1+rand.IntN(5))
		for j := range evs {
			evs[j] = gen.Event(rand.IntN(20))
		}
		txid := testenv.NewUUID()
		committed, known := s.commit(ctx, db, evs, txid, rand.IntN(2) == 0, s.o.messages && w == 1)
		if !known {
			_ = db.Close(context.Background())
			db = nil
			committed = s.lookup(txid)
		}
		if committed {
			now := time.Now()
			s.mu.Lock()
			s.committed[w] = append(s.committed[w], evs...)
			for range evs {
				s.txids[w] = append(s.txids[w], txid)
				s.commitAt[w] = append(s.commitAt[w], now)
			}
			s.mu.Unlock()
		}
		time.Sleep(pause)
	}
}

// newLedger empties the record of what the two writers committed (events, transaction ids, commit times).
func (s *suite) newLedger() {
	s.committed, s.txids, s.commitAt = make([][]testenv.Event, 2), make([][]string, 2), make([][]time.Time, 2)
}

// commit writes evs in one transaction, as rows (deleted again with deleteAfter) or as WAL messages
// (asMessages). known is false when the connection failed at the commit, so that the outcome must be
// looked up.
func (s *suite) commit(ctx context.Context, db *pgx.Conn, evs []testenv.Event, txid string, deleteAfter, asMessages bool) (committed, known bool) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, !db.IsClosed()
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if asMessages {
		if err := testenv.EmitIn(ctx, tx, messagePrefix, evs); err != nil {
			return false, !db.IsClosed()
		}
		evs = nil
	}
	for _, e := range evs {
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.table+` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, headers)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, e.ID, e.Type, e.AggType, e.AggID, e.Version, e.Payload, e.Headers); err != nil {
			return false, !db.IsClosed()
		}
		if deleteAfter {
			if _, err := tx.Exec(ctx, `DELETE FROM `+s.table+` WHERE event_id = $1`, e.ID); err != nil {
				return false, !db.IsClosed()
			}
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.table+"_txlog (id) VALUES ($1)", txid); err != nil {
		return false, !db.IsClosed()
	}
	if err := tx.Commit(ctx); err != nil {
		return false, false
	}
	return true, true
}

// lookup says whether the transaction txid committed, once the database answers again.
// It does not use the writers' context, which ends when they stop, possibly with a commit unresolved.
func (s *suite) lookup(txid string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var found bool
	if err := s.admin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+s.table+"_txlog WHERE id = $1)", txid).Scan(&found)
	}); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: cannot resolve a commit's outcome:", err)
	}
	return found
}

// messagePrefix is the prefix of the WAL messages the second writer emits (-messages).
const messagePrefix = "chaos-outbox"
