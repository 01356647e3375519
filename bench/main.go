// Command bench measures how fast outbox-cdc drains a backlog: it writes N events with COPY while no
// router runs, starts bin/outbox-cdc, and times until Kafka holds every event and the slot has
// confirmed past the backlog. It prints the median of several runs, with the router's peak RSS and
// CPU time. Run it with `make bench` (which builds the binary and starts the local services).
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type result struct {
	drain     time.Duration // router start until every event is in Kafka
	confirmed time.Duration // router start until the slot confirmed past the backlog
	peakRSSKB int64
	cpu       time.Duration
	bytes     int64
}

func main() {
	events := flag.Int("events", 100000, "events in the backlog")
	payload := flag.Int("payload", 500, "approximate payload size in bytes (JSON)")
	txRows := flag.Int("tx-rows", 1000, "rows per COPY transaction")
	runs := flag.Int("runs", 3, "runs; the median is reported")
	binary := flag.String("binary", "bin/outbox-cdc", "router binary")
	flag.Parse()
	if err := run(*events, *payload, *txRows, *runs, *binary); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func devEnv() map[string]string {
	out := map[string]string{}
	if f, err := os.Open(filepath.Join(".dev", "env")); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
				out[k] = v
			}
		}
	}
	for _, k := range []string{"OUTBOX_CDC_POSTGRES", "OUTBOX_CDC_BROKERS"} {
		if v := os.Getenv(k); v != "" {
			out[k] = v
		}
	}
	return out
}

func run(events, payload, txRows, runs int, binary string) error {
	env := devEnv()
	pgURL, brokers := env["OUTBOX_CDC_POSTGRES"], env["OUTBOX_CDC_BROKERS"]
	if pgURL == "" || brokers == "" {
		return errors.New("OUTBOX_CDC_POSTGRES / OUTBOX_CDC_BROKERS unknown: run `make up` first")
	}
	fmt.Printf("outbox-cdc drain benchmark: %d events, ~%d B payload, %d rows per COPY transaction, %d runs\n", events, payload, txRows, runs)
	fmt.Printf("machine: %d cores, %s/%s, %s\n\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, time.Now().UTC().Format("2006-01-02"))
	var results []result
	for i := 1; i <= runs; i++ {
		r, err := once(pgURL, brokers, events, payload, txRows, binary, i)
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		fmt.Printf("run %d: drained in %s (%.0f events/s, %.1f MB/s), slot confirmed after %s, peak RSS %.1f MB, CPU %s\n",
			i, r.drain.Round(time.Millisecond), float64(events)/r.drain.Seconds(), float64(r.bytes)/r.drain.Seconds()/1e6,
			r.confirmed.Round(time.Millisecond), float64(r.peakRSSKB)/1024, r.cpu.Round(time.Millisecond))
		results = append(results, r)
	}
	med := func(f func(result) float64) float64 {
		v := make([]float64, len(results))
		for i, r := range results {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	fmt.Printf("\nmedian of %d runs:\n", runs)
	fmt.Printf("  drain throughput   %.0f events/s (%.1f MB/s of key+value)\n",
		med(func(r result) float64 { return float64(events) / r.drain.Seconds() }),
		med(func(r result) float64 { return float64(r.bytes) / r.drain.Seconds() / 1e6 }))
	fmt.Printf("  drain time         %.2f s (slot confirmed after %.2f s)\n",
		med(func(r result) float64 { return r.drain.Seconds() }), med(func(r result) float64 { return r.confirmed.Seconds() }))
	fmt.Printf("  router peak RSS    %.1f MB\n", med(func(r result) float64 { return float64(r.peakRSSKB) / 1024 }))
	fmt.Printf("  router CPU         %.2f s\n", med(func(r result) float64 { return r.cpu.Seconds() }))
	return nil
}

func once(pgURL, brokers string, events, payload, txRows int, binary string, n int) (res result, err error) {
	ctx := context.Background()
	db, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return res, err
	}
	defer db.Close(ctx)
	id := fmt.Sprintf("bench_%d_%d", time.Now().Unix(), n)
	table, pub, slot, topic := "public."+id, "pub_"+id, "slot_"+id, "bench."+strings.ReplaceAll(id, "_", "-")
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE TABLE %s (event_id uuid PRIMARY KEY, event_type text NOT NULL, aggregate_type text,
			aggregate_id text NOT NULL, aggregate_version bigint, payload jsonb NOT NULL, headers jsonb,
			created_at timestamptz NOT NULL DEFAULT now())`, table),
		fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`, pub, table),
		fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, slot),
	} {
		if _, err := db.Exec(ctx, stmt); err != nil {
			return res, fmt.Errorf("set up: %w", err)
		}
	}
	defer func() {
		_, _ = db.Exec(ctx, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot))
		_, _ = db.Exec(ctx, fmt.Sprintf("DROP PUBLICATION %s", pub))
		_, _ = db.Exec(ctx, fmt.Sprintf("DROP TABLE %s", table))
	}()

	// The backlog, written while no router runs.
	filler := strings.Repeat("x", max(payload-120, 1))
	var row int
	for row < events {
		rows := make([][]any, 0, txRows)
		for i := 0; i < txRows && row < events; i++ {
			agg := fmt.Sprintf("order-%d", row%1000)
			rows = append(rows, []any{uuid(), "OrderPlaced", "order", agg, int64(row/1000 + 1),
				fmt.Sprintf(`{"order_id": %q, "seq": %d, "note": %q}`, agg, row, filler), nil})
			res.bytes += int64(len(agg) + payload)
			row++
		}
		if _, err := db.CopyFrom(ctx, pgx.Identifier{"public", id},
			[]string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "payload", "headers"},
			pgx.CopyFromRows(rows)); err != nil {
			return res, fmt.Errorf("copy: %w", err)
		}
	}
	var target string
	if err := db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
		return res, err
	}
	targetLSN, _ := pglogrepl.ParseLSN(target)

	adm, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return res, err
	}
	defer adm.Close()
	admin := kadm.NewClient(adm)
	if _, err := admin.CreateTopic(ctx, 3, -1, nil, topic); err != nil {
		return res, fmt.Errorf("create topic: %w", err)
	}
	defer func() { _, _ = admin.DeleteTopics(ctx, topic) }()

	cmd := exec.Command(binary, "run")
	cmd.Env = append(os.Environ(), "OUTBOX_CDC_POSTGRES="+pgURL, "OUTBOX_CDC_BROKERS="+brokers,
		"OUTBOX_CDC_TABLE="+table, "OUTBOX_CDC_SLOT="+slot, "OUTBOX_CDC_PUBLICATION="+pub,
		"OUTBOX_CDC_TOPIC="+topic, "OUTBOX_CDC_LOG_LEVEL=warn", "OUTBOX_CDC_METRICS_ADDR=127.0.0.1:0", "OUTBOX_CDC_STATUS_INTERVAL=1s")
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	deadline := start.Add(10 * time.Minute)
	for res.drain == 0 || res.confirmed == 0 {
		if time.Now().After(deadline) {
			return res, errors.New("backlog not drained within 10 minutes")
		}
		if rss := peakRSS(cmd.Process.Pid); rss > res.peakRSSKB {
			res.peakRSSKB = rss
		}
		if res.drain == 0 {
			ends, err := admin.ListEndOffsets(ctx, topic)
			if err == nil {
				var total int64
				ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
				if total >= int64(events) {
					res.drain = time.Since(start)
				}
			}
		}
		if res.confirmed == 0 {
			var c *string
			if err := db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&c); err == nil && c != nil {
				if lsn, _ := pglogrepl.ParseLSN(*c); lsn >= targetLSN {
					res.confirmed = time.Since(start)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.peakRSSKB = max(res.peakRSSKB, peakRSS(cmd.Process.Pid))
	res.cpu = cpuTime(cmd.Process.Pid)
	return res, nil
}

// peakRSS reads VmHWM (the peak resident set) of a process, in kB.
func peakRSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
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
