package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// latency is one steady-load point: events written at a rate for a while, each one's latency from the
// moment its transaction's COMMIT was sent to the moment a consumer (or, for the decode floor, a
// logical-replication reader) received it.
type latency struct {
	rate               int     // requested events/s
	achieved           float64 // events/s actually written
	sent, seen         int
	p50, p99, p999     time.Duration
	behind             bool // not every event was received within the grace period after the last write
	trailMed, trailMax int64
	commits            float64 // Kafka transactions committed per second while writing (outbox-cdc exactly-once)
}

// commitTimes maps an event id to the moment its transaction's COMMIT was sent.
type commitTimes struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func newCommitTimes() *commitTimes { return &commitTimes{m: make(map[string]time.Time)} }

func (c *commitTimes) set(ids []string, t time.Time) {
	c.mu.Lock()
	for _, id := range ids {
		c.m[id] = t
	}
	c.mu.Unlock()
}

func (c *commitTimes) get(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[id]
	return t, ok
}

// samples collects latencies from several goroutines.
type samples struct {
	mu   sync.Mutex
	d    []time.Duration
	seen map[string]bool
}

func newSamples() *samples { return &samples{seen: make(map[string]bool)} }

// add records the latency of the event id once (a redelivered copy does not count twice).
func (s *samples) add(id string, d time.Duration) {
	s.mu.Lock()
	if !s.seen[id] {
		s.seen[id] = true
		s.d = append(s.d, d)
	}
	s.mu.Unlock()
}

func (s *samples) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.d)
}

// quantiles fills p50/p99/p99.9 from the samples.
func (s *samples) quantiles(l *latency) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.seen = len(s.d)
	if len(s.d) == 0 {
		return
	}
	sort.Slice(s.d, func(i, j int) bool { return s.d[i] < s.d[j] })
	q := func(p float64) time.Duration { return s.d[min(int(p*float64(len(s.d))), len(s.d)-1)] }
	l.p50, l.p99, l.p999 = q(0.50), q(0.99), q(0.999)
}

// writers is the number of writing connections for a rate: one per 4,000 events/s, so that the
// writers' round trips do not cap the rate.
func writers(rate int) int { return 1 + rate/4000 }

// writeLoad inserts rate events/s into table in transactions of k rows (one multi-row INSERT, then
// COMMIT) for d, from writers(rate) connections; each transaction's ids and the moment its COMMIT
// was sent go to times. It returns the number of events written and the achieved rate.
func (b *bench) writeLoad(ctx context.Context, t *target, rate, k int, d time.Duration, times *commitTimes) (int, float64, error) {
	w := writers(rate)
	interval := time.Duration(float64(time.Second) * float64(k*w) / float64(rate))
	var sent atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, w)
	start := time.Now()
	end := start.Add(d)
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, b.c.pgURL)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			insert := "INSERT INTO " + t.table + ` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload)
				SELECT id, 'OrderPlaced', 'order', agg, v, p FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::jsonb[]) AS r(id, agg, v, p)`
			args := func(ids, aggs []string, vers []int64, pays []string) []any { return []any{ids, aggs, vers, pays} }
			if t.messages {
				insert = emitMessages
				args = func(ids, aggs []string, vers []int64, pays []string) []any {
					return []any{ids, aggs, vers, pays, t.messagePrefix()}
				}
			}
			// Start the writers a fraction of an interval apart.
			next := start.Add(interval * time.Duration(i) / time.Duration(w))
			ids, aggs, vers, pays := make([]string, k), make([]string, k), make([]int64, k), make([]string, k)
			for seq := i; time.Now().Before(end); {
				if wait := time.Until(next); wait > 0 {
					time.Sleep(wait)
				}
				next = next.Add(interval)
				for j := range k {
					ids[j] = uuid()
					aggs[j] = fmt.Sprintf("order-%d", seq%1000)
					vers[j] = int64(seq)
					pays[j] = fmt.Sprintf(`{"order_id": %q, "seq": %d}`, aggs[j], seq)
					seq += w
				}
				tx, err := conn.Begin(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				if _, err := tx.Exec(ctx, insert, args(ids, aggs, vers, pays)...); err != nil {
					_ = tx.Rollback(ctx)
					errs[i] = err
					return
				}
				times.set(ids, time.Now())
				if err := tx.Commit(ctx); err != nil {
					errs[i] = err
					return
				}
				sent.Add(int64(k))
			}
		}(i)
	}
	wg.Wait()
	n := int(sent.Load())
	return n, perSecond(n, time.Since(start)), errors.Join(errs...)
}

// consumeLatencies reads topic from its end until stop, recording each record's latency by its event
// id header (event_id for outbox-cdc and the Kafka floor, id for Debezium's EventRouter).
func (b *bench) consumeLatencies(ctx context.Context, topic string, readCommitted bool, times *commitTimes, out *samples) (stop func(), err error) {
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(b.c.brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(100 * time.Millisecond)}
	if readCommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	} else {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	}
	cons, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	// Position the consumer before anything is written.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cons.PollFetches(pctx)
	cancel()
	cctx, cancelConsume := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			fetches := cons.PollFetches(cctx)
			now := time.Now()
			fetches.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key != "event_id" && h.Key != "id" {
						continue
					}
					id := strings.Trim(string(h.Value), `"`)
					if t0, ok := times.get(id); ok {
						out.add(id, now.Sub(t0))
					}
					return
				}
			})
		}
	}()
	return func() { cancelConsume(); <-done; cons.Close() }, nil
}

// waitSeen waits until out holds n samples, or grace passes without a new one.
func waitSeen(out *samples, n int, grace time.Duration) bool {
	last, lastChange := out.count(), time.Now()
	for {
		got := out.count()
		if got >= n {
			return true
		}
		if got != last {
			last, lastChange = got, time.Now()
		}
		if time.Since(lastChange) > grace {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// steady runs one load point through the running system: rate events/s for the configured duration,
// latencies measured by a consumer, the slot's trail and the process's peak RSS sampled meanwhile.
func (b *bench) steady(ctx context.Context, pid int, t *target, rate int, m *measured) (*latency, error) {
	times, out := newCommitTimes(), newSamples()
	stop, err := b.consumeLatencies(ctx, t.topic, t.exactlyOnce(), times, out)
	if err != nil {
		return nil, err
	}
	defer stop()
	// In exactly-once mode, how many Kafka transactions the load made (the commit histogram's count).
	const commitSeconds = "outbox_cdc_kafka_transaction_commit_seconds"
	var commitsBefore histogram
	if t.exactlyOnce() {
		if commitsBefore, err = scrapeHistogram(ctx, t.metricsAddr, commitSeconds); err != nil {
			return nil, err
		}
	}
	sctx, stopSampling := context.WithCancel(ctx)
	var trail []int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			var lag int64
			// ctx, not sctx: pgx closes a connection whose query is cancelled, and b.db serves the rest of the run.
			if err := b.db.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", t.slot).Scan(&lag); err == nil {
				trail = append(trail, lag)
			}
			m.peakRSSKB = max(m.peakRSSKB, peakRSS(pid))
		}
	}()
	l := &latency{rate: rate}
	began := time.Now()
	l.sent, l.achieved, err = b.writeLoad(ctx, t, rate, b.c.steadyRows, b.c.steadyFor, times)
	stopSampling()
	<-sampled
	if err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if t.exactlyOnce() {
		after, err := scrapeHistogram(ctx, t.metricsAddr, commitSeconds)
		if err != nil {
			return nil, err
		}
		_, n := after.quantileSince(commitsBefore, 0.5)
		l.commits = float64(n) / time.Since(began).Seconds()
	}
	l.behind = !waitSeen(out, l.sent, 15*time.Second)
	out.quantiles(l)
	sort.Slice(trail, func(i, j int) bool { return trail[i] < trail[j] })
	if len(trail) > 0 {
		l.trailMed, l.trailMax = trail[len(trail)/2], trail[len(trail)-1]
	}
	return l, nil
}
