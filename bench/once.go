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

// target is one system's private objects: its table, publication, slot and topic. Both systems get
// the same rows; neither can share the other's slot.
type target struct {
	system                  string // outbox-cdc or debezium
	table, pub, slot, topic string
	lastTxLSN               pglogrepl.LSN // WAL position right after its backlog's last transaction
}

// measured is one system's figures in one run. Times are from its process's start.
type measured struct {
	firstRecord, drain, confirmed time.Duration // confirmed < 0: not reached within 15 s of the drain
	peakRSSKB                     int64
	cpu                           time.Duration
	p50, p99, p999                time.Duration
	trailMed, trailMax            int64
}

// bench is one run's shared state.
type bench struct {
	c            config
	db           *pgx.Conn
	admin        *kadm.Client
	kcl          *kgo.Client
	id           string
	ceilingSlot  string
	ceilingTopic string
	records      [][]any // the backlog rows, the same for every system and the Kafka ceiling
	workDir      string
}

func once(c config, n int) (res result, err error) {
	ctx := context.Background()
	b := &bench{c: c, id: fmt.Sprintf("bench_%d_%d", time.Now().Unix(), n)}
	b.ceilingSlot, b.ceilingTopic = "ceil_"+b.id, "bench."+strings.ReplaceAll(b.id, "_", "-")+".ceiling"
	if b.db, err = pgx.Connect(ctx, c.pgURL); err != nil {
		return res, err
	}
	defer b.db.Close(ctx)
	if b.kcl, err = kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...)); err != nil {
		return res, err
	}
	defer b.kcl.Close()
	b.admin = kadm.NewClient(b.kcl)
	if b.workDir, err = os.MkdirTemp("", "outbox-cdc-bench"); err != nil {
		return res, err
	}
	defer os.RemoveAll(b.workDir)

	systems := c.systems()
	var targets []*target
	defer func() {
		for _, t := range targets {
			b.cleanup(t)
		}
		b.dropCeiling()
	}()
	for _, sys := range systems {
		t := &target{system: sys}
		suffix := strings.NewReplacer("-", "", " ", "_", "=", "", ".", "").Replace(sys)
		t.table, t.pub, t.slot = "public."+b.id+"_"+suffix, "pub_"+b.id+"_"+suffix, "slot_"+b.id+"_"+suffix
		t.topic = "bench." + strings.ReplaceAll(b.id, "_", "-") + "." + suffix
		targets = append(targets, t)
		if err := b.setup(ctx, t); err != nil {
			return res, fmt.Errorf("set up %s: %w", sys, err)
		}
	}
	if _, err := b.db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.ceilingSlot); err != nil {
		return res, err
	}
	if _, err := b.admin.CreateTopic(ctx, 3, -1, nil, b.ceilingTopic); err != nil {
		return res, err
	}
	b.makeBacklog(&res)
	for _, t := range targets {
		if err := b.writeBacklog(ctx, t); err != nil {
			return res, err
		}
	}
	if res.decodeCeiling, err = b.decodeCeiling(ctx, targets[0]); err != nil {
		return res, fmt.Errorf("decode ceiling: %w", err)
	}
	res.systems = map[string]*measured{}
	for _, t := range targets {
		m, err := b.measure(ctx, t)
		if err != nil {
			return res, fmt.Errorf("%s: %w", t.system, err)
		}
		res.systems[t.system] = m
	}
	if res.kafkaCeiling, err = b.kafkaCeiling(ctx); err != nil {
		return res, fmt.Errorf("kafka ceiling: %w", err)
	}
	return res, nil
}

// measure starts the system, times the drain of its backlog, runs the steady load through it, and
// stops it.
func (b *bench) measure(ctx context.Context, t *target) (*measured, error) {
	var cmd *exec.Cmd
	var err error
	if t.system == "debezium" {
		cmd, err = b.startDebezium(t)
	} else {
		cmd, err = b.startRouter(t)
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	m := &measured{}
	if err := b.drain(ctx, cmd.Process.Pid, t, m); err != nil {
		return nil, err
	}
	if b.c.rate > 0 {
		if err := b.steady(ctx, cmd.Process.Pid, t, m); err != nil {
			return nil, fmt.Errorf("steady load: %w", err)
		}
	}
	m.peakRSSKB = max(m.peakRSSKB, peakRSS(cmd.Process.Pid))
	m.cpu = cpuTime(cmd.Process.Pid)
	return m, nil
}

func (b *bench) setup(ctx context.Context, t *target) error {
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE TABLE %s (event_id uuid PRIMARY KEY, event_type text NOT NULL, aggregate_type text,
			aggregate_id text NOT NULL, aggregate_version bigint, payload jsonb NOT NULL, headers jsonb,
			created_at timestamptz NOT NULL DEFAULT now())`, t.table),
		fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`, t.pub, t.table),
		fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, t.slot),
	} {
		if _, err := b.db.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	if _, err := b.admin.CreateTopic(ctx, 3, -1, nil, t.topic); err != nil {
		return fmt.Errorf("create topic %s: %w", t.topic, err)
	}
	return nil
}

func (b *bench) cleanup(t *target) {
	ctx := context.Background()
	_, _ = b.db.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", t.slot)
	_, _ = b.db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+t.pub)
	_, _ = b.db.Exec(ctx, "DROP TABLE IF EXISTS "+t.table)
	_, _ = b.admin.DeleteTopics(ctx, t.topic, t.topic+".checkpoints")
}

func (b *bench) dropCeiling() {
	ctx := context.Background()
	_, _ = b.db.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", b.ceilingSlot)
	_, _ = b.admin.DeleteTopics(ctx, b.ceilingTopic)
}

var columns = []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "payload", "headers"}

// makeBacklog builds the backlog's rows once; every system gets the same ones.
func (b *bench) makeBacklog(res *result) {
	filler := strings.Repeat("x", max(b.c.payload-120, 1))
	for row := 0; row < b.c.events; row++ {
		agg := fmt.Sprintf("order-%d", row%1000)
		b.records = append(b.records, []any{uuid(), "OrderPlaced", "order", agg, int64(row/1000 + 1),
			fmt.Sprintf(`{"order_id": %q, "seq": %d, "note": %q}`, agg, row, filler), nil})
		res.bytes += int64(len(agg) + b.c.payload)
	}
}

// writeBacklog copies the backlog into the target's table while no system runs.
func (b *bench) writeBacklog(ctx context.Context, t *target) error {
	schema, name, _ := strings.Cut(t.table, ".")
	for i := 0; i < len(b.records); i += b.c.txRows {
		rows := b.records[i:min(i+b.c.txRows, len(b.records))]
		if _, err := b.db.CopyFrom(ctx, pgx.Identifier{schema, name}, columns, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
	}
	var lsn string
	if err := b.db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	t.lastTxLSN, _ = pglogrepl.ParseLSN(lsn)
	return nil
}

// decodeCeiling times pg_recvlogical (pgoutput) reading the first target's WAL to /dev/null.
func (b *bench) decodeCeiling(ctx context.Context, t *target) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, "pg_recvlogical", "-d", b.c.pgURL, "--slot", b.ceilingSlot, "--start",
		"-o", "proto_version=2", "-o", "publication_names="+t.pub, "--endpos", t.lastTxLSN.String(), "-f", "/dev/null", "--no-loop")
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("pg_recvlogical: %w", err)
	}
	return time.Since(start), nil
}

// exactlyOnce reports whether the target is outbox-cdc in exactly-once mode.
func (t *target) exactlyOnce() bool { return t.system == systemEOS }

func (b *bench) startRouter(t *target) (*exec.Cmd, error) {
	cmd := exec.Command(b.c.binary, "run")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES="+b.c.pgURL, "OUTBOX_CDC_BROKERS="+b.c.brokers,
		"OUTBOX_CDC_TABLE="+t.table, "OUTBOX_CDC_SLOT="+t.slot, "OUTBOX_CDC_PUBLICATION="+t.pub,
		"OUTBOX_CDC_TOPIC="+t.topic, "OUTBOX_CDC_LOG_LEVEL=warn", "OUTBOX_CDC_METRICS_ADDR=127.0.0.1:0",
		"OUTBOX_CDC_STATUS_INTERVAL=1s")
	if t.exactlyOnce() {
		cmd.Env = append(cmd.Env, "OUTBOX_CDC_DELIVERY=exactly-once", "OUTBOX_CDC_CHECKPOINT_TOPIC="+t.topic+".checkpoints")
	}
	if t.system == b.c.lingerSystem() {
		cmd.Env = append(cmd.Env, "OUTBOX_CDC_LINGER="+b.c.altLinger.String())
	}
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

// drain waits until Kafka holds every backlog event of the target and its slot confirmed past them.
func (b *bench) drain(ctx context.Context, pid int, t *target, m *measured) error {
	start := time.Now()
	deadline := start.Add(10 * time.Minute)
	for m.drain == 0 || m.confirmed == 0 {
		now := time.Now()
		if now.After(deadline) {
			return errors.New("backlog not drained within 10 minutes")
		}
		m.peakRSSKB = max(m.peakRSSKB, peakRSS(pid))
		if m.drain == 0 {
			n := b.endOffsets(ctx, t.topic)
			if n > 0 && m.firstRecord == 0 {
				m.firstRecord = time.Since(start)
			}
			// In exactly-once mode the offsets count transaction markers too, and records are
			// delivered only once committed: the slot's confirm, which follows the commit, says when.
			if n >= int64(b.c.events) && !t.exactlyOnce() {
				m.drain = time.Since(start)
			}
		}
		if m.confirmed == 0 && b.confirmedLSN(ctx, t.slot) >= t.lastTxLSN {
			m.confirmed = time.Since(start)
			if t.exactlyOnce() {
				m.drain = m.confirmed
			}
		}
		if m.drain > 0 && m.confirmed == 0 && time.Since(start) > m.drain+15*time.Second {
			m.confirmed = -time.Second
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

func (b *bench) confirmedLSN(ctx context.Context, slot string) pglogrepl.LSN {
	var c *string
	if err := b.db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&c); err != nil || c == nil {
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

// steady writes at the configured rate through the running system and measures commit-to-receipt
// latency with a consumer, and how far the slot's confirmed position trails the WAL.
func (b *bench) steady(ctx context.Context, pid int, t *target, m *measured) error {
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(b.c.brokers, ",")...), kgo.ConsumeTopics(t.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(10 * time.Millisecond)}
	if t.exactlyOnce() {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cons, err := kgo.NewClient(opts...)
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
	defer stopConsume()
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for consumeCtx.Err() == nil {
			fetches := cons.PollFetches(consumeCtx)
			now := time.Now()
			fetches.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "created_at" {
						if ts, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
							latMu.Lock()
							latencies = append(latencies, now.Sub(ts))
							latMu.Unlock()
						}
					}
				}
			})
		}
	}()

	writer, err := pgx.Connect(ctx, b.c.pgURL)
	if err != nil {
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
		if err := b.steadyTx(ctx, writer, t, &sent); err != nil {
			return err
		}
		if time.Since(lastSample) > 250*time.Millisecond {
			var lag int64
			if err := b.db.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", t.slot).Scan(&lag); err == nil {
				trail = append(trail, lag)
			}
			m.peakRSSKB = max(m.peakRSSKB, peakRSS(pid))
			lastSample = time.Now()
		}
	}
	// Wait for the last records.
	deadline := time.Now().Add(60 * time.Second)
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
	m.p50, m.p99, m.p999 = q(0.50), q(0.99), q(0.999)
	sort.Slice(trail, func(i, j int) bool { return trail[i] < trail[j] })
	if len(trail) > 0 {
		m.trailMed, m.trailMax = trail[len(trail)/2], trail[len(trail)-1]
	}
	return nil
}

// steadyTx writes one transaction of the steady load.
func (b *bench) steadyTx(ctx context.Context, writer *pgx.Conn, t *target, sent *int) error {
	tx, err := writer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for i := 0; i < b.c.steadyRows; i++ {
		agg := fmt.Sprintf("order-%d", *sent%1000)
		if _, err := tx.Exec(ctx, "INSERT INTO "+t.table+" (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload) VALUES ($1, 'OrderPlaced', 'order', $2, $3, $4)",
			uuid(), agg, int64(*sent), fmt.Sprintf(`{"order_id": %q, "seq": %d}`, agg, *sent)); err != nil {
			return err
		}
		*sent++
	}
	return tx.Commit(ctx)
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
