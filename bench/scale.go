package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// scaleConfig is make bench-scale's parameters.
type scaleConfig struct {
	events  int           // the backlog
	step    int           // events per reported step of the drain and the snapshot
	rate    int           // the long steady load, events/s
	minutes int           // its length; p99 is reported per minute
	resync  bool          // also time resync --snapshot-only on the table
	dur     time.Duration // one steady period (a minute; shorter only for a quick check)
}

// scaleStep is one step of a drain or a snapshot: how long it took and the router's RSS at its end.
type scaleStep struct {
	upTo    int64
	elapsed time.Duration
	rssKB   int64
}

// runScale measures outbox-cdc (at-least-once) on a large backlog and a long steady load: the backlog
// (written by PostgreSQL itself, generate_series in transactions of -tx-rows, so that the bench holds
// none of it) drained with throughput and RSS per step against pg_recvlogical's decode ceiling on the
// same WAL; then -scale-minutes at -scale-rate with p50/p99 per minute; then, with -scale-resync,
// resync --snapshot-only of the whole table into a fresh topic (rows/s and RSS per step).
func runScale(c config, s scaleConfig) (err error) {
	ctx := context.Background()
	b := &bench{c: c, id: fmt.Sprintf("bench_%d_scale", time.Now().Unix())}
	b.ceilingSlot = "ceil_" + b.id
	if b.db, err = pgx.Connect(ctx, c.pgURL); err != nil {
		return err
	}
	defer b.db.Close(ctx)
	if err := dropLeftovers(ctx, b.db); err != nil {
		return err
	}
	if b.kcl, err = kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...)); err != nil {
		return err
	}
	defer b.kcl.Close()
	b.admin = kadm.NewClient(b.kcl)
	t := b.newTarget("outbox-cdc")
	defer b.cleanup(t)
	defer b.dropCeiling()
	if err := b.setup(ctx, t); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	if _, err := b.db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.ceilingSlot); err != nil {
		return err
	}
	fmt.Printf("scale: writing %d events (~%d B payload, %d rows per transaction) with generate_series\n", s.events, c.payload, c.txRows)
	start := time.Now()
	if err := b.generateBacklog(ctx, t, s.events, c.payload, c.txRows, s.step); err != nil {
		return err
	}
	fmt.Printf("scale: written in %s\n", time.Since(start).Round(time.Second))
	ceiling, err := b.decodeCeiling(ctx, t)
	if err != nil {
		return fmt.Errorf("decode ceiling: %w", err)
	}
	b.dropCeiling() // its WAL is not needed any more
	ceilRate := perSecond(s.events, ceiling)
	fmt.Printf("scale: decode ceiling (pg_recvlogical, pgoutput, to /dev/null): %.0f events/s (%s)\n\n", ceilRate, ceiling.Round(time.Millisecond))

	cmd, err := b.startRouter(t)
	if err != nil {
		return err
	}
	stopRouter := func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	steps, err := b.follow(ctx, cmd.Process.Pid, t.topic, int64(s.events), int64(s.step), 30*time.Minute, nil)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	printSteps("drain", steps, ceilRate)

	if s.minutes > 0 {
		fmt.Printf("\nscale: steady load, %d events/s in transactions of %d rows for %d periods of %s (latency from COMMIT sent to a consumer's receipt)\n\n",
			s.rate, c.steadyRows, s.minutes, s.dur)
		fmt.Println("The router's own p99 is from its end_to_end_latency_seconds histogram over the period: from the commit")
		fmt.Println("record's time to Kafka's acknowledgement, as the upper bound of the histogram's bucket (powers of two).")
		fmt.Println("What the consumer's p99 adds to it is the COMMIT itself, the consumer's fetch, and the machine's other work.")
		fmt.Println()
		fmt.Println("| period | events/s written | p50 (ms) | p99 (ms) | p99.9 (ms) | router's p99, commit to ack (ms, at most) | RSS (MB) | slot trails WAL, median (bytes) |")
		fmt.Println("|---|---|---|---|---|---|---|---|")
		b.c.steadyFor = s.dur
		const e2e = "outbox_cdc_end_to_end_latency_seconds"
		before, err := scrapeHistogram(ctx, t.metricsAddr, e2e)
		if err != nil {
			return err
		}
		for i := 1; i <= s.minutes; i++ {
			m := &measured{}
			l, err := b.steady(ctx, cmd.Process.Pid, t, s.rate, m)
			if err != nil {
				return fmt.Errorf("steady period %d: %w", i, err)
			}
			after, err := scrapeHistogram(ctx, t.metricsAddr, e2e)
			if err != nil {
				return err
			}
			own, _ := after.quantileSince(before, 0.99)
			before = after
			behind := ""
			if l.behind {
				behind = fmt.Sprintf(" (behind: %d of %d seen)", l.seen, l.sent)
			}
			fmt.Printf("| %d | %.0f | %.1f | %.1f | %.1f | %.0f | %.1f | %d |%s\n", i, l.achieved, msf(l.p50), msf(l.p99), msf(l.p999),
				own*1000, float64(procStatusKB(cmd.Process.Pid, "VmRSS:"))/1024, l.trailMed, behind)
		}
	}
	fmt.Printf("\nscale: router peak RSS over the drain and the steady load: %.1f MB, CPU %.1f s\n",
		float64(peakRSS(cmd.Process.Pid))/1024, cpuTime(cmd.Process.Pid).Seconds())
	stopRouter()

	if !s.resync {
		return nil
	}
	// With -with-binary, that build's resync too, alternating with this one's, twice each.
	binaries := []string{b.c.binary}
	if b.c.altBinary != "" {
		binaries = []string{b.c.binary, b.c.altBinary, b.c.binary, b.c.altBinary}
	}
	for _, bin := range binaries {
		if err := b.scaleResync(ctx, t, s, bin); err != nil {
			return err
		}
	}
	return nil
}

// generateBacklog has PostgreSQL insert n events into t's table, txRows per transaction, and notes
// the WAL position after the last one.
func (b *bench) generateBacklog(ctx context.Context, t *target, n, payload, txRows, step int) error {
	insert := "INSERT INTO " + t.table + ` (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload)
		SELECT gen_random_uuid(), 'OrderPlaced', 'order', 'order-' || (g % 1000), g / 1000 + 1,
			jsonb_build_object('order_id', 'order-' || (g % 1000), 'seq', g, 'note', $3::text)
		FROM generate_series($1::bigint, $2::bigint) AS g`
	filler := strings.Repeat("x", max(payload-120, 1))
	start := time.Now()
	for from := 0; from < n; from += txRows {
		to := min(from+txRows, n) - 1
		if _, err := b.db.Exec(ctx, insert, from, to, filler); err != nil {
			return fmt.Errorf("insert rows %d to %d: %w", from, to, err)
		}
		if (to+1)%step == 0 {
			fmt.Printf("scale: %d written (%.0f rows/s)\n", to+1, perSecond(to+1, time.Since(start)))
		}
	}
	var lsn string
	if err := b.db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	t.lastTxLSN, _ = pglogrepl.ParseLSN(lsn)
	return nil
}

// follow samples topic's end offsets every 20 ms until they reach total, noting the time from the
// start and the process's RSS each time a multiple of step is passed. It gives up after limit, or
// once exited (if not nil) is closed and a last look found the offsets short.
func (b *bench) follow(ctx context.Context, pid int, topic string, total, step int64, limit time.Duration, exited <-chan struct{}) ([]scaleStep, error) {
	start := time.Now()
	var steps []scaleStep
	next := step
	for next <= total {
		if time.Since(start) > limit {
			return steps, fmt.Errorf("%d of %d events in Kafka after %s", next-step, total, limit)
		}
		gone := false
		select {
		case <-exited:
			gone = true
		default:
		}
		n := b.endOffsets(ctx, topic)
		if gone && n < next {
			return steps, fmt.Errorf("the process exited with %d of %d events in Kafka", n, total)
		}
		for n >= next && next <= total {
			steps = append(steps, scaleStep{upTo: next, elapsed: time.Since(start), rssKB: procStatusKB(pid, "VmRSS:")})
			next += step
		}
		time.Sleep(20 * time.Millisecond)
	}
	return steps, nil
}

// printSteps prints one table row per step: events/s within the step (and as a share of ceiling,
// if not 0) and the RSS at its end.
func printSteps(what string, steps []scaleStep, ceiling float64) {
	if ceiling > 0 {
		fmt.Printf("| %s: events | events/s in this step | / decode ceiling | RSS at its end (MB) |\n|---|---|---|---|\n", what)
	} else {
		fmt.Printf("| %s: events | events/s in this step | RSS at its end (MB) |\n|---|---|---|\n", what)
	}
	var prev scaleStep
	for _, st := range steps {
		r := perSecond(int(st.upTo-prev.upTo), st.elapsed-prev.elapsed)
		if ceiling > 0 {
			fmt.Printf("| %d | %.0f | %.2f | %.1f |\n", st.upTo, r, r/ceiling, float64(st.rssKB)/1024)
		} else {
			fmt.Printf("| %d | %.0f | %.1f |\n", st.upTo, r, float64(st.rssKB)/1024)
		}
		prev = st
	}
	if len(steps) > 0 && ceiling > 0 {
		last := steps[len(steps)-1]
		r := perSecond(int(last.upTo), last.elapsed)
		fmt.Printf("\nscale: %s of %d events, process start to last record: %s, %.0f events/s, %.2f of the decode ceiling\n",
			what, last.upTo, last.elapsed.Round(time.Millisecond), r, r/ceiling)
	}
}

// scaleResync times binary's `outbox-cdc resync --yes --snapshot-only` on t's whole table into a
// fresh topic.
func (b *bench) scaleResync(ctx context.Context, t *target, s scaleConfig, binary string) error {
	var rows int64
	if err := b.db.QueryRow(ctx, "SELECT count(*) FROM "+t.table).Scan(&rows); err != nil {
		return err
	}
	topic := fmt.Sprintf("%s.resync-%d", t.topic, time.Now().UnixNano())
	if _, err := b.admin.CreateTopic(ctx, 3, -1, nil, topic); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	defer func() { _, _ = b.admin.DeleteTopics(context.Background(), topic) }()
	cmd := exec.Command(binary, "resync", "--yes", "--snapshot-only")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES="+b.c.pgURL, "OUTBOX_CDC_BROKERS="+b.c.routerBrokers,
		"OUTBOX_CDC_TABLE="+t.table, "OUTBOX_CDC_SLOT="+t.slot, "OUTBOX_CDC_PUBLICATION="+t.pub,
		"OUTBOX_CDC_TOPIC="+topic, "OUTBOX_CDC_LOG_LEVEL=warn", "OUTBOX_CDC_METRICS_ADDR=127.0.0.1:0")
	cmd.Stderr = os.Stderr
	fmt.Printf("\nscale: %s resync --snapshot-only of the table (%d rows) into a new topic\n\n", binary, rows)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	done, exited := make(chan error, 1), make(chan struct{})
	// The peak is VmHWM sampled while it runs: the rusage of a child started by os/exec reports at
	// least the RSS of the bench process itself (the child's high-water mark survives exec from the
	// shared memory of the fork), which here holds millions of events.
	var hwm atomic.Int64
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-exited:
				return
			case <-tick.C:
				hwm.Store(max(hwm.Load(), peakRSS(cmd.Process.Pid)))
			}
		}
	}()
	go func() { done <- cmd.Wait(); close(exited) }()
	steps, ferr := b.follow(ctx, cmd.Process.Pid, topic, rows-rows%int64(s.step), int64(s.step), 30*time.Minute, exited)
	if ferr != nil {
		_ = cmd.Process.Kill()
	}
	err := <-done
	wall := time.Since(start)
	if err = errors.Join(err, ferr); err != nil {
		return fmt.Errorf("resync: %w", err)
	}
	printSteps("resync", steps, 0)
	maxRSS := hwm.Load()
	fmt.Printf("scale: %s resync of %d rows: %s from start to exit, %.0f rows/s, peak RSS (VmHWM, sampled) %.1f MB, CPU %.1f s\n",
		binary, rows, wall.Round(time.Millisecond), perSecond(int(rows), wall), float64(maxRSS)/1024,
		(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds())
	return nil
}
