package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// target is one system's private objects: its table, publication, slot and topic. Both systems get
// the same rows; neither can share the other's slot.
type target struct {
	system                  string // outbox-cdc or debezium
	eos                     bool   // outbox-cdc in exactly-once mode (systemEOS, or -with-env OUTBOX_CDC_DELIVERY=exactly-once)
	messages                bool   // events are written as WAL messages of messagePrefix, not rows (systemMessages)
	table, pub, slot, topic string
	lastTxLSN               pglogrepl.LSN // WAL position right after its backlog's last transaction
	metricsAddr             string        // where the running outbox-cdc serves /metrics (startRouter)
}

// measured is one system's figures in one run. Times are from its process's start.
type measured struct {
	firstRecord, drain, confirmed time.Duration // confirmed < 0: not reached within 15 s of the drain
	peakRSSKB                     int64
	cpu                           time.Duration
	curve                         []*latency // one point per steady rate, in order; stops after a point it fell behind at
	contended                     []*latency // the same at -contended-rates, with the CPU burner running
}

// at returns the curve's point at rate, or nil.
func (m *measured) at(rate int) *latency { return pointAt(m.curve, rate) }

// pointAt returns curve's point at rate, or nil.
func pointAt(curve []*latency, rate int) *latency {
	for _, l := range curve {
		if l.rate == rate {
			return l
		}
	}
	return nil
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
	floorTarget  *target // table and publication of the floor's reader (its slot is temporary)
	targets      int     // targets named so far
}

func once(c config, n int) (res result, err error) {
	ctx := context.Background()
	b := &bench{c: c, id: fmt.Sprintf("bench_%d_%d", time.Now().Unix(), n)}
	b.ceilingSlot, b.ceilingTopic = "ceil_"+b.id, "bench."+strings.ReplaceAll(b.id, "_", "-")+".ceiling"
	if b.db, err = pgx.Connect(ctx, c.pgURL); err != nil {
		return res, err
	}
	defer b.db.Close(ctx)
	if err := dropLeftovers(ctx, b.db); err != nil {
		return res, err
	}
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
		t := b.newTarget(sys)
		targets = append(targets, t)
		if err := b.setup(ctx, t); err != nil {
			return res, fmt.Errorf("set up %s: %w", sys, err)
		}
	}
	if len(c.rates) > 0 {
		b.floorTarget = b.newTarget("floor")
		targets = append(targets, b.floorTarget)
		if err := b.setup(ctx, b.floorTarget); err != nil {
			return res, fmt.Errorf("set up the floor: %w", err)
		}
	}
	if _, err := b.db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.ceilingSlot); err != nil {
		return res, err
	}
	if _, err := b.admin.CreateTopic(ctx, 3, -1, nil, b.ceilingTopic); err != nil {
		return res, err
	}
	if c.compare {
		// The tuned Debezium's heartbeats; kept between runs.
		r, err := b.admin.CreateTopic(ctx, 1, -1, nil, heartbeatTopic)
		if err = errors.Join(err, r.Err); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return res, fmt.Errorf("create %s: %w", heartbeatTopic, err)
		}
	}
	b.records = makeRecords(c.events, c.payload)
	res.bytes = recordBytes(b.records)
	for _, t := range targets[:len(systems)] {
		if err := b.writeBacklog(ctx, t, b.records, c.txRows); err != nil {
			return res, err
		}
	}
	if res.decodeCeiling, err = b.decodeCeiling(ctx, targets[0]); err != nil {
		return res, fmt.Errorf("decode ceiling: %w", err)
	}
	res.systems = map[string]*measured{}
	for _, t := range targets[:len(systems)] {
		m, err := b.measure(ctx, t)
		if err != nil {
			return res, fmt.Errorf("%s: %w", t.system, err)
		}
		res.systems[t.system] = m
	}
	if res.kafkaCeiling, err = b.kafkaCeiling(ctx); err != nil {
		return res, fmt.Errorf("kafka ceiling: %w", err)
	}
	for _, r := range c.rates {
		var f floor
		if f.decode, err = b.decodeFloor(ctx, b.floorTarget, r); err != nil {
			return res, fmt.Errorf("decode floor at %d events/s: %w", r, err)
		}
		if f.kafka, err = b.kafkaFloor(ctx, b.ceilingTopic, r); err != nil {
			return res, fmt.Errorf("kafka floor at %d events/s: %w", r, err)
		}
		res.floors = append(res.floors, f)
	}
	if len(c.contendedRates) > 0 {
		stop, err := startBurner()
		if err != nil {
			return res, err
		}
		for _, r := range c.contendedRates {
			var f floor
			if f.decode, err = b.decodeFloor(ctx, b.floorTarget, r); err == nil {
				f.kafka, err = b.kafkaFloor(ctx, b.ceilingTopic, r)
			}
			if err != nil {
				stop()
				return res, fmt.Errorf("floor at %d events/s under contention: %w", r, err)
			}
			res.contendedFloors = append(res.contendedFloors, f)
		}
		stop()
	}
	if res.sweeps, err = b.sweeps(ctx); err != nil {
		return res, fmt.Errorf("sweeps: %w", err)
	}
	return res, nil
}

// newTarget names a system's table, publication, slot and topic in this run.
func (b *bench) newTarget(sys string) *target {
	t := &target{system: sys, eos: sys == systemEOS || (sys == b.c.altSystem() && slices.Contains(strings.Split(b.c.altEnv, ","), "OUTBOX_CDC_DELIVERY=exactly-once")),
		messages: sys == systemMessages}
	b.targets++
	suffix := fmt.Sprintf("s%d", b.targets) // system names may hold characters no identifier takes
	t.table, t.pub, t.slot = "public."+b.id+"_"+suffix, "pub_"+b.id+"_"+suffix, "slot_"+b.id+"_"+suffix
	t.topic = "bench." + strings.ReplaceAll(b.id, "_", "-") + "." + suffix
	return t
}

// measure starts the system, times the drain of its backlog, runs the steady load through it, and
// stops it.
func (b *bench) measure(ctx context.Context, t *target) (*measured, error) {
	var cmd *exec.Cmd
	var err error
	switch t.system {
	case systemDebezium, systemDebeziumTuned:
		cmd, err = b.startDebezium(t, t.system == systemDebeziumTuned)
	default:
		cmd, err = b.startRouter(t)
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	m := &measured{}
	if err := b.drain(ctx, cmd.Process.Pid, t, b.c.events, m); err != nil {
		return nil, err
	}
	for _, r := range b.c.rates {
		l, err := b.steady(ctx, cmd.Process.Pid, t, r, m)
		if err != nil {
			return nil, fmt.Errorf("steady load at %d events/s: %w", r, err)
		}
		m.curve = append(m.curve, l)
		if l.behind {
			break // higher rates would only queue more
		}
	}
	if len(b.c.contendedRates) > 0 {
		stop, err := startBurner()
		if err != nil {
			return nil, err
		}
		for _, r := range b.c.contendedRates {
			l, err := b.steady(ctx, cmd.Process.Pid, t, r, m)
			if err != nil {
				stop()
				return nil, fmt.Errorf("steady load at %d events/s under contention: %w", r, err)
			}
			if m.contended = append(m.contended, l); l.behind {
				break
			}
		}
		stop()
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
		if t.system == "floor" && strings.Contains(stmt, "pg_create_logical_replication_slot") {
			continue // the floor reader's slot is temporary
		}
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

// dropLeftovers drops what an interrupted earlier run left in PostgreSQL: its inactive slots pin WAL
// (gigabytes after a few runs) and slow every later run, its tables and publications take space.
func dropLeftovers(ctx context.Context, db *pgx.Conn) error {
	if _, err := db.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE NOT active AND database = current_database() AND (slot_name LIKE 'slot\_bench\_%' OR slot_name LIKE 'ceil\_bench\_%')`); err != nil {
		return fmt.Errorf("drop the slots of earlier runs: %w", err)
	}
	rows, err := db.Query(ctx, `SELECT 'DROP PUBLICATION ' || quote_ident(pubname) FROM pg_publication WHERE pubname LIKE 'pub\_bench\_%'
		UNION ALL SELECT 'DROP TABLE ' || quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'bench\_%'`)
	if err != nil {
		return fmt.Errorf("list the publications and tables of earlier runs: %w", err)
	}
	drops, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list the publications and tables of earlier runs: %w", err)
	}
	for _, d := range drops {
		if _, err := db.Exec(ctx, d); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	return nil
}

func (b *bench) dropCeiling() {
	ctx := context.Background()
	_, _ = b.db.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", b.ceilingSlot)
	_, _ = b.admin.DeleteTopics(ctx, b.ceilingTopic)
}

var columns = []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "payload", "headers"}

// makeRecords builds n backlog rows with about payload bytes of JSON each.
func makeRecords(n, payload int) [][]any {
	filler := strings.Repeat("x", max(payload-120, 1))
	records := make([][]any, 0, n)
	for row := 0; row < n; row++ {
		agg := fmt.Sprintf("order-%d", row%1000)
		records = append(records, []any{uuid(), "OrderPlaced", "order", agg, int64(row/1000 + 1),
			fmt.Sprintf(`{"order_id": %q, "seq": %d, "note": %q}`, agg, row, filler), nil})
	}
	return records
}

// recordBytes is the key and value bytes of the records.
func recordBytes(records [][]any) int64 {
	var n int64
	for _, r := range records {
		n += int64(len(r[3].(string)) + len(r[5].(string)))
	}
	return n
}

// messagePrefix is the prefix of a target's WAL messages: its table's name.
func (t *target) messagePrefix() string { return t.table }

// emitMessages is one statement emitting a transactional WAL message per element of the arrays (ids,
// aggregate ids, versions, payloads), with the prefix $5; the content holds the outbox's fields.
const emitMessages = `SELECT count(pg_logical_emit_message(true, $5, json_build_object('event_id', id, 'event_type', 'OrderPlaced',
	'aggregate_type', 'order', 'aggregate_id', agg, 'aggregate_version', v, 'payload', p)::text))
	FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::jsonb[]) AS r(id, agg, v, p)`

// writeBacklog copies rows into the target's table in transactions of txRows while no system runs
// (for a messages target, emits them as WAL messages, txRows per transaction).
func (b *bench) writeBacklog(ctx context.Context, t *target, records [][]any, txRows int) error {
	schema, name, _ := strings.Cut(t.table, ".")
	for i := 0; i < len(records); i += txRows {
		rows := records[i:min(i+txRows, len(records))]
		if t.messages {
			ids, aggs, vers, pays := make([]string, len(rows)), make([]string, len(rows)), make([]int64, len(rows)), make([]string, len(rows))
			for j, r := range rows {
				ids[j], aggs[j], vers[j], pays[j] = r[0].(string), r[3].(string), r[4].(int64), r[5].(string)
			}
			if _, err := b.db.Exec(ctx, emitMessages, ids, aggs, vers, pays, t.messagePrefix()); err != nil {
				return fmt.Errorf("emit messages: %w", err)
			}
			continue
		}
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
func (t *target) exactlyOnce() bool { return t.eos }

func (b *bench) startRouter(t *target) (*exec.Cmd, error) {
	binary := b.c.binary
	if t.system == b.c.altSystem() && b.c.altBinary != "" {
		binary = b.c.altBinary
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	t.metricsAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(binary, "run")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES="+b.c.pgURL, "OUTBOX_CDC_BROKERS="+b.c.routerBrokers,
		"OUTBOX_CDC_TABLE="+t.table, "OUTBOX_CDC_SLOT="+t.slot, "OUTBOX_CDC_PUBLICATION="+t.pub,
		"OUTBOX_CDC_TOPIC="+t.topic, "OUTBOX_CDC_LOG_LEVEL=warn", "OUTBOX_CDC_METRICS_ADDR="+t.metricsAddr,
		"OUTBOX_CDC_STATUS_INTERVAL=1s")
	if t.messages {
		cmd.Env = append(cmd.Env, "OUTBOX_CDC_MESSAGE_PREFIXES="+t.messagePrefix())
	}
	if t.exactlyOnce() {
		cmd.Env = append(cmd.Env, "OUTBOX_CDC_DELIVERY=exactly-once", "OUTBOX_CDC_CHECKPOINT_TOPIC="+t.topic+".checkpoints")
	}
	if t.system == b.c.altSystem() && b.c.altEnv != "" {
		cmd.Env = append(cmd.Env, strings.Split(b.c.altEnv, ",")...)
	}
	cmd.Stderr = os.Stderr
	return cmd, cmd.Start()
}

// drain waits until Kafka holds every backlog event of the target and its slot confirmed past them.
func (b *bench) drain(ctx context.Context, pid int, t *target, events int, m *measured) error {
	start := time.Now()
	var committed func() pglogrepl.LSN
	if t.exactlyOnce() {
		var stop func()
		var err error
		if committed, stop, err = b.watchCheckpoints(ctx, t.topic+".checkpoints"); err != nil {
			return err
		}
		defer stop()
	}
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
			// delivered only once committed: the checkpoint committed with the last of them says when
			// (not the slot's confirm, which waits for the next status update).
			if t.exactlyOnce() {
				if committed() >= t.lastTxLSN {
					m.drain = time.Since(start)
				}
			} else if n >= int64(events) {
				m.drain = time.Since(start)
			}
		}
		if m.confirmed == 0 && b.confirmedLSN(ctx, t.slot) >= t.lastTxLSN {
			m.confirmed = time.Since(start)
		}
		if m.drain > 0 && m.confirmed == 0 && time.Since(start) > m.drain+15*time.Second {
			m.confirmed = -time.Second
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// watchCheckpoints reads an exactly-once target's checkpoint topic (read_committed) until stop, and
// returns the position of the last checkpoint committed so far: every record of the transactions
// before it is visible to read_committed consumers.
func (b *bench) watchCheckpoints(ctx context.Context, topic string) (last func() pglogrepl.LSN, stop func(), err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.c.brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, nil, fmt.Errorf("read checkpoints: %w", err)
	}
	var lsn atomic.Uint64
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			cl.PollFetches(cctx).EachRecord(func(r *kgo.Record) {
				if cp, err := checkpoint.ParseRecord(r.Key, r.Value); err == nil && uint64(cp.LSN) > lsn.Load() {
					lsn.Store(uint64(cp.LSN))
				}
			})
		}
	}()
	return func() pglogrepl.LSN { return pglogrepl.LSN(lsn.Load()) }, func() { cancel(); <-done; cl.Close() }, nil
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

// peakRSS reads VmHWM (the peak resident set) of a process, in kB.
func peakRSS(pid int) int64 { return procStatusKB(pid, "VmHWM:") }

// procStatusKB reads a kB figure (VmHWM:, VmRSS:, ...) of /proc/PID/status; 0 when unknown.
func procStatusKB(pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field) {
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
