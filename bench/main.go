// Command bench measures outbox-cdc on the local services (`make up`) and prints one table:
//
//   - drain: N events written with COPY while no router runs, then bin/outbox-cdc started; time until
//     Kafka holds every event (events/s, MB/s), until the slot confirmed past them, the router's peak
//     RSS and CPU seconds;
//   - ceilings on the same data in the same run: pg_recvlogical (pgoutput) draining the same WAL to
//     /dev/null (the decode ceiling) and a raw franz-go producer sending the same records (the Kafka
//     ceiling), with the router's ratio to each;
//   - steady load: R events/s in transactions of k rows for T seconds through the running router;
//     end-to-end latency (commit to a consumer's receipt) p50/p99/p99.9 and how far the slot's
//     confirmed_flush_lsn trails.
//
// Figures are medians over -runs runs. Run it with `make bench`.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// config is the benchmark's parameters.
type config struct {
	pgURL, brokers, binary  string
	events, payload, txRows int
	rate, steadyRows        int
	steadyFor               time.Duration
	compare                 bool
	altLinger               time.Duration // > 0: also outbox-cdc (at-least-once) with this kafka.linger
}

func main() {
	var c config
	flag.IntVar(&c.events, "events", 100000, "events in the backlog")
	flag.IntVar(&c.payload, "payload", 500, "approximate payload size in bytes (JSON)")
	flag.IntVar(&c.txRows, "tx-rows", 1000, "rows per COPY transaction of the backlog")
	flag.IntVar(&c.rate, "rate", 2000, "steady load: events per second (0 skips the steady workload)")
	flag.IntVar(&c.steadyRows, "k", 10, "steady load: rows per transaction")
	flag.DurationVar(&c.steadyFor, "duration", 20*time.Second, "steady load: how long")
	runs := flag.Int("runs", 3, "runs; medians are reported")
	flag.BoolVar(&c.compare, "compare", false, "also run the same workloads through Debezium 3.6.1 on Kafka Connect (make bench-compare)")
	flag.StringVar(&c.binary, "binary", "bin/outbox-cdc", "router binary")
	flag.DurationVar(&c.altLinger, "with-linger", 0, "also run outbox-cdc with this kafka.linger, side by side (e.g. 10ms)")
	flag.Parse()
	env := devEnv()
	c.pgURL, c.brokers = env["OUTBOX_CDC_POSTGRES"], env["OUTBOX_CDC_BROKERS"]
	if err := run(c, *runs); err != nil {
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

// result is one run's figures.
type result struct {
	bytes         int64
	decodeCeiling time.Duration // pg_recvlogical over the same WAL
	kafkaCeiling  time.Duration // raw franz-go producer, same records
	systems       map[string]*measured
}

// streamRate is a system's drain throughput from its first record to its last.
func streamRate(events int, m *measured) float64 { return rate(events, m.drain-m.firstRecord) }

func run(c config, runs int) error {
	if c.pgURL == "" || c.brokers == "" {
		return errors.New("OUTBOX_CDC_POSTGRES / OUTBOX_CDC_BROKERS unknown: run `make up` first")
	}
	fmt.Printf("outbox-cdc benchmark, %s, %d cores %s/%s; PostgreSQL and Kafka on the same machine\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("drain: %d events, ~%d B JSON payload, COPY in transactions of %d rows; steady: %d events/s in transactions of %d for %s\n\n",
		c.events, c.payload, c.txRows, c.rate, c.steadyRows, c.steadyFor)
	systems := c.systems()
	var results []result
	for i := 1; i <= runs; i++ {
		r, err := once(c, i)
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		fmt.Printf("run %d: decode ceiling %.0f ev/s, kafka ceiling %.0f ev/s\n", i, rate(c.events, r.decodeCeiling), rate(c.events, r.kafkaCeiling))
		for _, sys := range systems {
			m := r.systems[sys]
			fmt.Printf("  %-10s drain %.0f ev/s (first record after %s, all after %s), peak RSS %.1f MB, CPU %.2f s, steady p50 %s p99 %s p99.9 %s\n",
				sys, streamRate(c.events, m), m.firstRecord.Round(time.Millisecond), m.drain.Round(time.Millisecond),
				float64(m.peakRSSKB)/1024, m.cpu.Seconds(), ms(m.p50), ms(m.p99), ms(m.p999))
		}
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
	sysMed := func(sys string, f func(*measured) float64) float64 {
		return med(func(r result) float64 { return f(r.systems[sys]) })
	}
	decode := med(func(r result) float64 { return rate(c.events, r.decodeCeiling) })
	kafka := med(func(r result) float64 { return rate(c.events, r.kafkaCeiling) })
	bytesPerRun := results[0].bytes
	type row struct {
		name string
		f    func(*measured) float64
		unit string
	}
	rows := []row{
		{"drain throughput, first to last record (events/s)", func(m *measured) float64 { return streamRate(c.events, m) }, "%.0f"},
		{"drain throughput, first to last record (MB/s of key+value)", func(m *measured) float64 {
			return float64(bytesPerRun) / (m.drain - m.firstRecord).Seconds() / 1e6
		}, "%.1f"},
		{"drain: first record after start (s)", func(m *measured) float64 { return m.firstRecord.Seconds() }, "%.2f"},
		{"drain: all records after start (s)", func(m *measured) float64 { return m.drain.Seconds() }, "%.2f"},
		{"drain: slot confirmed past the backlog after start (s; -1: not within 15 s)", func(m *measured) float64 { return m.confirmed.Seconds() }, "%.2f"},
		{"peak RSS (MB)", func(m *measured) float64 { return float64(m.peakRSSKB) / 1024 }, "%.1f"},
		{"CPU, drain + steady (s)", func(m *measured) float64 { return m.cpu.Seconds() }, "%.2f"},
	}
	if c.rate > 0 {
		rows = append(rows,
			row{"steady end-to-end latency p50 (ms)", func(m *measured) float64 { return msf(m.p50) }, "%.1f"},
			row{"steady end-to-end latency p99 (ms)", func(m *measured) float64 { return msf(m.p99) }, "%.1f"},
			row{"steady end-to-end latency p99.9 (ms)", func(m *measured) float64 { return msf(m.p999) }, "%.1f"},
			row{"steady: confirmed_flush_lsn trails the WAL, median (bytes)", func(m *measured) float64 { return float64(m.trailMed) }, "%.0f"},
			row{"steady: confirmed_flush_lsn trails the WAL, max (bytes)", func(m *measured) float64 { return float64(m.trailMax) }, "%.0f"},
		)
	}
	// Ratios of medians, each pair measured side by side in the same runs.
	at := func(name string) int { return slices.Index(systems, name) }
	ratios := [][2]int{{1, 0}} // exactly-once / at-least-once
	if c.altLinger > 0 {
		ratios = append(ratios, [2]int{0, at(c.lingerSystem())})
	}
	if c.compare {
		ratios = append(ratios, [2]int{0, at("debezium")})
	}
	fmt.Printf("\nmedians of %d runs\n\n| figure | %s |", runs, strings.Join(systems, " | "))
	for _, r := range ratios {
		fmt.Printf(" %s / %s |", systems[r[0]], systems[r[1]])
	}
	fmt.Printf("\n|---|%s%s\n", strings.Repeat("---|", len(systems)), strings.Repeat("---|", len(ratios)))
	for _, r := range rows {
		fmt.Printf("| %s |", r.name)
		var vals []float64
		for _, sys := range systems {
			v := sysMed(sys, r.f)
			vals = append(vals, v)
			fmt.Printf(" "+r.unit+" |", v)
		}
		for _, q := range ratios {
			if vals[q[1]] > 0 && vals[q[0]] >= 0 {
				fmt.Printf(" %.2f |", vals[q[0]]/vals[q[1]])
			} else {
				fmt.Printf(" - |")
			}
		}
		fmt.Println()
	}
	router := sysMed("outbox-cdc", func(m *measured) float64 { return streamRate(c.events, m) })
	fmt.Printf("\nceilings on the same data: pg_recvlogical (decode) %.0f events/s, raw franz-go producer (Kafka) %.0f events/s\n", decode, kafka)
	fmt.Printf("outbox-cdc / decode ceiling %.2f, outbox-cdc / Kafka ceiling %.2f\n", router/decode, router/kafka)
	eos := sysMed(systemEOS, func(m *measured) float64 { return streamRate(c.events, m) })
	fmt.Printf("%s / decode ceiling %.2f, exactly-once / at-least-once drain %.2f\n", systemEOS, eos/decode, eos/router)
	if c.compare {
		dbz := sysMed("debezium", func(m *measured) float64 { return streamRate(c.events, m) })
		fmt.Printf("debezium / decode ceiling %.2f, debezium / Kafka ceiling %.2f\n", dbz/decode, dbz/kafka)
	}
	return nil
}

// systemEOS is outbox-cdc in exactly-once mode (kafka.delivery=exactly-once; read back read_committed).
const systemEOS = "outbox-cdc exactly-once"

// systems are the systems measured in each run, in this order: outbox-cdc (at-least-once), outbox-cdc
// in exactly-once mode, and Debezium with -compare.
func (c config) systems() []string {
	s := []string{"outbox-cdc", systemEOS}
	if c.altLinger > 0 {
		s = append(s, c.lingerSystem())
	}
	if c.compare {
		s = append(s, "debezium")
	}
	return s
}

// lingerSystem names outbox-cdc run with -with-linger.
func (c config) lingerSystem() string { return "outbox-cdc linger=" + c.altLinger.String() }

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
