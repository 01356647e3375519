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
	flag.StringVar(&c.binary, "binary", "bin/outbox-cdc", "router binary")
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
	drain, confirmed  time.Duration // router start until every event is in Kafka / the slot confirmed past them
	decodeCeiling     time.Duration // pg_recvlogical over the same WAL
	kafkaCeiling      time.Duration // raw franz-go producer, same records
	peakRSSKB         int64
	cpu               time.Duration
	bytes             int64
	p50, p99, p999    time.Duration // steady load, commit to receipt
	steadyEvents      int
	trailMed, trailMx int64 // steady load: bytes confirmed_flush_lsn trails pg_current_wal_lsn()
}

func run(c config, runs int) error {
	if c.pgURL == "" || c.brokers == "" {
		return errors.New("OUTBOX_CDC_POSTGRES / OUTBOX_CDC_BROKERS unknown: run `make up` first")
	}
	fmt.Printf("outbox-cdc benchmark, %s, %d cores %s/%s; PostgreSQL and Kafka on the same machine\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("drain: %d events, ~%d B JSON payload, COPY in transactions of %d rows; steady: %d events/s in transactions of %d for %s\n\n",
		c.events, c.payload, c.txRows, c.rate, c.steadyRows, c.steadyFor)
	var results []result
	for i := 1; i <= runs; i++ {
		r, err := once(c, i)
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		fmt.Printf("run %d: router %.0f ev/s, decode ceiling %.0f ev/s, kafka ceiling %.0f ev/s, peak RSS %.1f MB, CPU %.2f s, steady p50 %s p99 %s p99.9 %s\n",
			i, rate(c.events, r.drain), rate(c.events, r.decodeCeiling), rate(c.events, r.kafkaCeiling),
			float64(r.peakRSSKB)/1024, r.cpu.Seconds(), ms(r.p50), ms(r.p99), ms(r.p999))
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
	router := med(func(r result) float64 { return rate(c.events, r.drain) })
	decode := med(func(r result) float64 { return rate(c.events, r.decodeCeiling) })
	kafka := med(func(r result) float64 { return rate(c.events, r.kafkaCeiling) })
	fmt.Printf("\nmedians of %d runs\n", runs)
	fmt.Printf("| figure | outbox-cdc | decode ceiling (pg_recvlogical) | Kafka ceiling (raw franz-go) |\n|---|---|---|---|\n")
	fmt.Printf("| drain throughput | %.0f events/s (%.1f MB/s) | %.0f events/s | %.0f events/s |\n", router,
		med(func(r result) float64 { return float64(r.bytes) / r.drain.Seconds() / 1e6 }), decode, kafka)
	fmt.Printf("| outbox-cdc / ceiling | | %.2f | %.2f |\n", router/decode, router/kafka)
	fmt.Printf("| drain time, slot confirmed after | %.2f s, %.2f s | | |\n",
		med(func(r result) float64 { return r.drain.Seconds() }), med(func(r result) float64 { return r.confirmed.Seconds() }))
	fmt.Printf("| router peak RSS | %.1f MB | | |\n", med(func(r result) float64 { return float64(r.peakRSSKB) / 1024 }))
	fmt.Printf("| router CPU (drain + steady) | %.2f s | | |\n", med(func(r result) float64 { return r.cpu.Seconds() }))
	if c.rate > 0 {
		fmt.Printf("| steady end-to-end latency p50 / p99 / p99.9 | %.1f / %.1f / %.1f ms | | |\n",
			med(func(r result) float64 { return msf(r.p50) }), med(func(r result) float64 { return msf(r.p99) }), med(func(r result) float64 { return msf(r.p999) }))
		fmt.Printf("| steady: confirmed_flush_lsn trails the WAL by (median / max) | %.0f / %.0f bytes | | |\n",
			med(func(r result) float64 { return float64(r.trailMed) }), med(func(r result) float64 { return float64(r.trailMx) }))
	}
	return nil
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
