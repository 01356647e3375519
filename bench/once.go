package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// bench is one run's objects: a table, its publication, the router's slot, a second slot for the
// decode ceiling, and topics.
type bench struct {
	c                   config
	db                  *pgx.Conn
	admin               *kadm.Client
	kcl                 *kgo.Client
	id, table, pub      string
	slot, ceilingSlot   string
	topic, ceilingTopic string
	records             [][]any // the backlog rows, reused for the Kafka ceiling
	targetLSN           pglogrepl.LSN
}

func once(c config, n int) (res result, err error) {
	ctx := context.Background()
	b := &bench{c: c, id: fmt.Sprintf("bench_%d_%d", time.Now().Unix(), n)}
	b.table, b.pub, b.slot, b.ceilingSlot = "public."+b.id, "pub_"+b.id, "slot_"+b.id, "ceil_"+b.id
	b.topic = "bench." + strings.ReplaceAll(b.id, "_", "-")
	b.ceilingTopic = b.topic + ".ceiling"
	if b.db, err = pgx.Connect(ctx, c.pgURL); err != nil {
		return res, err
	}
	defer b.db.Close(ctx)
	if b.kcl, err = kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...)); err != nil {
		return res, err
	}
	defer b.kcl.Close()
	b.admin = kadm.NewClient(b.kcl)
	defer b.cleanup()
	if err := b.setup(ctx); err != nil {
		return res, fmt.Errorf("set up: %w", err)
	}
	if err := b.writeBacklog(ctx, &res); err != nil {
		return res, err
	}
	if res.decodeCeiling, err = b.decodeCeiling(ctx); err != nil {
		return res, fmt.Errorf("decode ceiling: %w", err)
	}
	router, err := b.startRouter()
	if err != nil {
		return res, err
	}
	defer func() { _ = router.Process.Kill(); _ = router.Wait() }()
	if err := b.drain(ctx, router.Process.Pid, &res); err != nil {
		return res, err
	}
	if c.rate > 0 {
		if err := b.steady(ctx, router.Process.Pid, &res); err != nil {
			return res, fmt.Errorf("steady load: %w", err)
		}
	}
	res.peakRSSKB = max(res.peakRSSKB, peakRSS(router.Process.Pid))
	res.cpu = cpuTime(router.Process.Pid)
	if res.kafkaCeiling, err = b.kafkaCeiling(ctx); err != nil {
		return res, fmt.Errorf("kafka ceiling: %w", err)
	}
	return res, nil
}

func (b *bench) setup(ctx context.Context) error {
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE TABLE %s (event_id uuid PRIMARY KEY, event_type text NOT NULL, aggregate_type text,
			aggregate_id text NOT NULL, aggregate_version bigint, payload jsonb NOT NULL, headers jsonb,
			created_at timestamptz NOT NULL DEFAULT now())`, b.table),
		fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`, b.pub, b.table),
		fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, b.slot),
		fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, b.ceilingSlot),
	} {
		if _, err := b.db.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	for _, t := range []string{b.topic, b.ceilingTopic} {
		if _, err := b.admin.CreateTopic(ctx, 3, -1, nil, t); err != nil {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}

func (b *bench) cleanup() {
	ctx := context.Background()
	for _, s := range []string{b.slot, b.ceilingSlot} {
		_, _ = b.db.Exec(ctx, "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1", s)
	}
	_, _ = b.db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+b.pub)
	_, _ = b.db.Exec(ctx, "DROP TABLE IF EXISTS "+b.table)
	_, _ = b.admin.DeleteTopics(ctx, b.topic, b.ceilingTopic)
}

var columns = []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "payload", "headers"}

// writeBacklog copies the events into the table while no router runs.
func (b *bench) writeBacklog(ctx context.Context, res *result) error {
	filler := strings.Repeat("x", max(b.c.payload-120, 1))
	for row := 0; row < b.c.events; {
		rows := make([][]any, 0, b.c.txRows)
		for i := 0; i < b.c.txRows && row < b.c.events; i++ {
			agg := fmt.Sprintf("order-%d", row%1000)
			rows = append(rows, []any{uuid(), "OrderPlaced", "order", agg, int64(row/1000 + 1),
				fmt.Sprintf(`{"order_id": %q, "seq": %d, "note": %q}`, agg, row, filler), nil})
			res.bytes += int64(len(agg) + b.c.payload)
			row++
		}
		schema, name, _ := strings.Cut(b.table, ".")
		if _, err := b.db.CopyFrom(ctx, pgx.Identifier{schema, name}, columns, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		b.records = append(b.records, rows...)
	}
	var target string
	if err := b.db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
		return err
	}
	b.targetLSN, _ = pglogrepl.ParseLSN(target)
	return nil
}

// decodeCeiling times pg_recvlogical (pgoutput) reading the same WAL to /dev/null.
func (b *bench) decodeCeiling(ctx context.Context) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, "pg_recvlogical", "-d", b.c.pgURL, "--slot", b.ceilingSlot, "--start",
		"-o", "proto_version=2", "-o", "publication_names="+b.pub, "--endpos", b.targetLSN.String(), "-f", "/dev/null", "--no-loop")
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("pg_recvlogical: %w", err)
	}
	return time.Since(start), nil
}

func (b *bench) startRouter() (*exec.Cmd, error) {
	cmd := exec.Command(b.c.binary, "run")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES="+b.c.pgURL, "OUTBOX_CDC_BROKERS="+b.c.brokers,
		"OUTBOX_CDC_TABLE="+b.table, "OUTBOX_CDC_SLOT="+b.slot, "OUTBOX_CDC_PUBLICATION="+b.pub,
		"OUTBOX_CDC_TOPIC="+b.topic, "OUTBOX_CDC_LOG_LEVEL=warn", "OUTBOX_CDC_METRICS_ADDR=127.0.0.1:0",
		"OUTBOX_CDC_STATUS_INTERVAL=1s")
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

// drain waits until Kafka holds every backlog event and the slot confirmed past them.
func (b *bench) drain(ctx context.Context, pid int, res *result) error {
	start := time.Now()
	deadline := start.Add(10 * time.Minute)
	for res.drain == 0 || res.confirmed == 0 {
		if time.Now().After(deadline) {
			return errors.New("backlog not drained within 10 minutes")
		}
		res.peakRSSKB = max(res.peakRSSKB, peakRSS(pid))
		if res.drain == 0 && b.endOffsets(ctx, b.topic) >= int64(b.c.events) {
			res.drain = time.Since(start)
		}
		if res.confirmed == 0 && b.confirmedLSN(ctx) >= b.targetLSN {
			res.confirmed = time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func (b *bench) endOffsets(ctx context.Context, topic string) int64 {
	ends, err := b.admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	return total
}

func (b *bench) confirmedLSN(ctx context.Context) pglogrepl.LSN {
	var c *string
	if err := b.db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", b.slot).Scan(&c); err != nil || c == nil {
		return 0
	}
	lsn, _ := pglogrepl.ParseLSN(*c)
	return lsn
}

// kafkaCeiling times a raw franz-go producer (same defaults: idempotent, acks=all) sending the same
// keys and values.
func (b *bench) kafkaCeiling(ctx context.Context) (time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.c.brokers, ",")...), kgo.MaxBufferedRecords(20000))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	for _, r := range b.records {
		wg.Add(1)
		rec := &kgo.Record{Topic: b.ceilingTopic, Key: []byte(r[3].(string)), Value: []byte(r[5].(string)),
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(r[0].(string))}, {Key: "event_type", Value: []byte("OrderPlaced")}}}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				firstErr = errors.Join(firstErr, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// steady writes at the configured rate through the running router and measures commit-to-receipt
// latency with a consumer, and how far the slot's confirmed position trails the WAL.
func (b *bench) steady(ctx context.Context, pid int, res *result) error {
	cons, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.c.brokers, ",")...), kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		return err
	}
	defer cons.Close()
	// Make sure the consumer is positioned before writing.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cons.PollFetches(pctx)
	cancel()

	var latencies []time.Duration
	var latMu sync.Mutex
	consumeCtx, stopConsume := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for consumeCtx.Err() == nil {
			fetches := cons.PollFetches(consumeCtx)
			now := time.Now()
			fetches.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "created_at" {
						if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
							latMu.Lock()
							latencies = append(latencies, now.Sub(t))
							latMu.Unlock()
						}
					}
				}
			})
		}
	}()

	writer, err := pgx.Connect(ctx, b.c.pgURL)
	if err != nil {
		stopConsume()
		return err
	}
	defer writer.Close(ctx)
	interval := time.Duration(float64(time.Second) * float64(b.c.steadyRows) / float64(b.c.rate))
	next := time.Now()
	end := next.Add(b.c.steadyFor)
	var trail []int64
	lastSample := time.Now()
	sent := 0
	for time.Now().Before(end) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		tx, err := writer.Begin(ctx)
		if err != nil {
			stopConsume()
			return err
		}
		for i := 0; i < b.c.steadyRows; i++ {
			agg := fmt.Sprintf("order-%d", sent%1000)
			if _, err := tx.Exec(ctx, "INSERT INTO "+b.table+" (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload) VALUES ($1, 'OrderPlaced', 'order', $2, $3, $4)",
				uuid(), agg, int64(sent), fmt.Sprintf(`{"order_id": %q, "seq": %d}`, agg, sent)); err != nil {
				stopConsume()
				return err
			}
			sent++
		}
		if err := tx.Commit(ctx); err != nil {
			stopConsume()
			return err
		}
		if time.Since(lastSample) > 250*time.Millisecond {
			var lag int64
			if err := b.db.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", b.slot).Scan(&lag); err == nil {
				trail = append(trail, lag)
			}
			res.peakRSSKB = max(res.peakRSSKB, peakRSS(pid))
			lastSample = time.Now()
		}
	}
	// Wait for the last records.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		latMu.Lock()
		got := len(latencies)
		latMu.Unlock()
		if got >= sent {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopConsume()
	<-consumed
	if len(latencies) < sent {
		return fmt.Errorf("consumer saw %d of %d events", len(latencies), sent)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	q := func(p float64) time.Duration { return latencies[min(int(p*float64(len(latencies))), len(latencies)-1)] }
	res.p50, res.p99, res.p999, res.steadyEvents = q(0.50), q(0.99), q(0.999), sent
	sort.Slice(trail, func(i, j int) bool { return trail[i] < trail[j] })
	if len(trail) > 0 {
		res.trailMed, res.trailMx = trail[len(trail)/2], trail[len(trail)-1]
	}
	return nil
}

// peakRSS reads VmHWM (the peak resident set) of a process, in kB.
func peakRSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			if f := strings.Fields(line); len(f) >= 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

// cpuTime reads user+system CPU time of a running process from /proc.
func cpuTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
