package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	outboxsql "github.com/outbox-cdc/outbox-cdc/sql"
)

// carrier is one way an application writes an event in its transaction.
type carrier struct {
	name  string
	table string // the outbox table it writes ("" for none)
	write func(ctx context.Context, tx pgx.Tx, table, id string, i int, payload string) error
}

var carriers = []carrier{
	{name: "insert", table: "bench_wc_insert", write: func(ctx context.Context, tx pgx.Tx, table, id string, i int, payload string) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (event_id, event_type, aggregate_type, aggregate_id, payload) VALUES ($1, 'OrderPaid', 'order', $2, $3)", id, strconv.Itoa(i%500), payload)
		return err
	}},
	{name: "insert+delete", table: "bench_wc_delete", write: func(ctx context.Context, tx pgx.Tx, table, id string, i int, payload string) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (event_id, event_type, aggregate_type, aggregate_id, payload) VALUES ($1, 'OrderPaid', 'order', $2, $3)", id, strconv.Itoa(i%500), payload); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM "+table+" WHERE event_id = $1", id)
		return err
	}},
	{name: "message", write: func(ctx context.Context, tx pgx.Tx, _, id string, i int, payload string) error {
		_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', json_build_object('event_id', $1::text, 'event_type', 'OrderPaid',
			'aggregate_type', 'order', 'aggregate_id', $2::text, 'payload', $3::jsonb)::text)`, id, strconv.Itoa(i%500), payload)
		return err
	}},
}

// writeCost is one carrier's figures in one run.
type writeCost struct {
	walPerEvent, eventsPerSec float64
	p50, p99                  time.Duration
}

// runWriteCost measures what an event costs the database by each carrier (bench -write-cost N): N
// events, one per transaction (a writer on one connection: BEGIN, the carrier's statements, COMMIT),
// the carriers side by side in each run in a rotating order. Per carrier: WAL bytes per event, the
// writer's events/s, and the transaction's latency (BEGIN to COMMIT returned) p50/p99; then the
// outbox tables' size and what autovacuum did after the runs. Medians of the runs.
func runWriteCost(c config, adminURL string, n, runs int) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	for _, cr := range carriers {
		if cr.table == "" {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+cr.table); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, outboxsql.TableDDL(cr.table)); err != nil {
			return fmt.Errorf("create %s: %w", cr.table, err)
		}
	}
	payload := `{"order_id": 42, "total_cents": 999, "note": ""}`
	if pad := c.payload - len(payload); pad > 0 {
		payload = `{"order_id": 42, "total_cents": 999, "note": "` + strings.Repeat("x", pad) + `"}`
	}
	fmt.Printf("write cost: %d events per carrier and run, one event per transaction, ~%d B payload, %d runs (carriers in rotating order)\n", n, len(payload), runs)
	results := map[string][]writeCost{}
	seq := 0
	for run := 0; run < runs; run++ {
		for k := range carriers {
			cr := carriers[(k+run)%len(carriers)]
			var startLSN, endLSN string
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&startLSN); err != nil {
				return err
			}
			lat := make([]time.Duration, 0, n)
			began := time.Now()
			for i := 0; i < n; i++ {
				seq++
				id := fmt.Sprintf("00000000-0000-4000-8000-%012d", seq)
				t0 := time.Now()
				tx, err := conn.Begin(ctx)
				if err != nil {
					return err
				}
				if err := cr.write(ctx, tx, cr.table, id, i, payload); err != nil {
					_ = tx.Rollback(ctx)
					return fmt.Errorf("%s: %w", cr.name, err)
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
				lat = append(lat, time.Since(t0))
			}
			elapsed := time.Since(began)
			var wal float64
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&endLSN); err != nil {
				return err
			}
			if err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8", endLSN, startLSN).Scan(&wal); err != nil {
				return err
			}
			slices.Sort(lat)
			w := writeCost{walPerEvent: wal / float64(n), eventsPerSec: float64(n) / elapsed.Seconds(), p50: lat[len(lat)/2], p99: lat[len(lat)*99/100]}
			results[cr.name] = append(results[cr.name], w)
			fmt.Printf("  run %d %-14s %7.0f WAL bytes/event, %6.0f events/s, latency p50 %v p99 %v\n", run+1, cr.name, w.walPerEvent, w.eventsPerSec,
				w.p50.Round(time.Microsecond), w.p99.Round(time.Microsecond))
		}
	}
	pick := func(name string, f func(writeCost) float64) float64 {
		var v []float64
		for _, r := range results[name] {
			v = append(v, f(r))
		}
		return median(v)
	}
	fmt.Printf("\n| carrier | WAL bytes/event | events/s (one writer) | commit p50 (ms) | commit p99 (ms) | WAL / insert+delete | p50 / insert+delete |\n|---|---|---|---|---|---|---|\n")
	base := func(f func(writeCost) float64) float64 { return pick("insert+delete", f) }
	wal := func(w writeCost) float64 { return w.walPerEvent }
	p50 := func(w writeCost) float64 { return float64(w.p50) / 1e6 }
	for _, cr := range carriers {
		fmt.Printf("| %s | %.0f | %.0f | %.3f | %.3f | %.2f | %.2f |\n", cr.name, pick(cr.name, wal), pick(cr.name, func(w writeCost) float64 { return w.eventsPerSec }),
			pick(cr.name, p50), pick(cr.name, func(w writeCost) float64 { return float64(w.p99) / 1e6 }),
			pick(cr.name, wal)/base(wal), pick(cr.name, p50)/base(p50))
	}
	// What the tables hold after the runs, and what vacuum had to do (autovacuum runs on its own
	// schedule: its counters are read after a pause, and the dead tuples left say what it still must).
	time.Sleep(5 * time.Second)
	fmt.Printf("\nafter %d events per carrier:\n| table | carrier | total size | index size | live rows | dead rows | autovacuum runs |\n|---|---|---|---|---|---|---|\n", n*runs)
	for _, cr := range carriers {
		if cr.table == "" {
			fmt.Printf("| — | %s | 0 | 0 | 0 | 0 | 0 |\n", cr.name)
			continue
		}
		var total, index, live, dead, autovac int64
		if err := conn.QueryRow(ctx, `SELECT pg_total_relation_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup, autovacuum_count
			FROM pg_stat_user_tables WHERE relname = $1`, cr.table).Scan(&total, &index, &live, &dead, &autovac); err != nil {
			return fmt.Errorf("%s: %w", cr.table, err)
		}
		fmt.Printf("| %s | %s | %.1f MB | %.1f MB | %d | %d | %d |\n", cr.table, cr.name, float64(total)/1e6, float64(index)/1e6, live, dead, autovac)
	}
	for _, cr := range carriers {
		if cr.table != "" {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+cr.table); err != nil {
				return err
			}
		}
	}
	return nil
}
