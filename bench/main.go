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
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/faultnet"
)

// config is the benchmark's parameters.
type config struct {
	pgURL, brokers, binary  string
	events, payload, txRows int
	rate, steadyRows        int
	rates                   []int // the latency curve's rates; includes rate
	contendedRates          []int // the rates measured again with the CPU burner running
	payloads, txSizes       []int // the throughput sweeps
	sweepEvents             int
	steadyFor               time.Duration
	compare                 bool
	messages                bool   // also outbox-cdc reading the same events as WAL messages (systemMessages)
	charts                  string // directory for the SVG charts; empty: none
	altEnv                  string // not empty: also outbox-cdc (at-least-once) with these settings (KEY=VALUE,...)
	altBinary               string // not empty: that outbox-cdc runs this binary (e.g. one built from an older commit)
	// routerBrokers are the brokers outbox-cdc itself is given: brokers, or with -kafka-rtt the
	// delaying proxy in front of the broker's remote listener.
	routerBrokers string
}

func main() {
	var c config
	var rates, payloads, txSizes string
	flag.IntVar(&c.events, "events", 100000, "events in the backlog")
	flag.IntVar(&c.payload, "payload", 500, "approximate payload size in bytes (JSON)")
	flag.IntVar(&c.txRows, "tx-rows", 1000, "rows per COPY transaction of the backlog")
	flag.IntVar(&c.rate, "rate", 2000, "steady load: the headline rate, events per second (0 skips the steady workloads)")
	flag.StringVar(&rates, "rates", "500,2000,10000,30000", "steady load: the latency curve's rates, events per second")
	flag.IntVar(&c.steadyRows, "k", 10, "steady load: rows per transaction")
	flag.DurationVar(&c.steadyFor, "duration", 10*time.Second, "steady load: how long at each rate")
	flag.StringVar(&payloads, "payloads", "100,1000,8000,64000", "throughput sweep: payload sizes in bytes (empty skips)")
	flag.StringVar(&txSizes, "tx-sizes", "1,10,100,1000,10000", "throughput sweep: rows per transaction (empty skips)")
	flag.IntVar(&c.sweepEvents, "sweep-events", 50000, "throughput sweep: events per point (fewer for large payloads)")
	runs := flag.Int("runs", 3, "runs; medians are reported")
	fleetBudget := flag.String("fleet-budgets", "", "with -fleet: also drain -events over 4 busy sources with each of these fleet.max_inflight_bytes (bytes, comma-separated; e.g. 67108864,1099511627776 for the default against none), -runs times, side by side")
	fleetCounts := flag.String("fleet", "", "instead of the rest: one process with each of these numbers of sources (e.g. 1,10,50): RSS, connections and CPU idle and under -rate events/s, and the drain of -events over 1 and 4 sources")
	writeCostEvents := flag.Int("write-cost", 0, "instead of the rest: what an event costs PostgreSQL written as an insert, an insert and delete, and a WAL message (pg_logical_emit_message): WAL bytes, commit latency, a writer's events/s, table size and vacuum, on this many events per carrier and run")
	inboxEvents := flag.Int("inbox", 0, "instead of the rest: package inbox's throughput on this many events, beside a bare consumer running the same insert")
	var sc scaleConfig
	flag.IntVar(&sc.events, "scale", 0, "instead of the rest (make bench-scale): drain a backlog of this many events, written by PostgreSQL itself, printing throughput and RSS per -scale-step; then the long steady load; then resync (with -with-binary, that build's resync too, alternating)")
	flag.IntVar(&sc.step, "scale-step", 1000000, "with -scale: events per reported step")
	flag.IntVar(&sc.rate, "scale-rate", 30000, "with -scale: the long steady load's rate, events/s")
	flag.IntVar(&sc.minutes, "scale-minutes", 10, "with -scale: the long steady load's length in minutes, p99 per minute (0 skips it)")
	flag.DurationVar(&sc.dur, "scale-period", time.Minute, "with -scale: one reported period of the steady load")
	flag.BoolVar(&sc.resync, "scale-resync", true, "with -scale: then time resync --snapshot-only of the whole table")
	flag.BoolVar(&c.messages, "messages", false, "also run outbox-cdc (at-least-once) on the same events written as transactional WAL messages (pg_logical_emit_message, postgres.message_prefixes) instead of rows, side by side")
	flag.BoolVar(&c.compare, "compare", false, "also run the same workloads through Debezium 3.6.1 on Kafka Connect, with defaults and tuned (make bench-compare)")
	flag.StringVar(&c.charts, "charts", "", "write SVG charts of the curve and the sweeps to this directory")
	flag.StringVar(&c.binary, "binary", "bin/outbox-cdc", "router binary")
	flag.StringVar(&c.altEnv, "with-env", "", "also run outbox-cdc (at-least-once, or exactly-once with OUTBOX_CDC_DELIVERY=exactly-once, then read back read_committed) with these environment settings, side by side (e.g. OUTBOX_CDC_LINGER=0,OUTBOX_CDC_QUIET_FLUSH=1ms)")
	flag.StringVar(&c.altBinary, "with-binary", "", "also run this outbox-cdc binary (at-least-once), side by side: a change against the commit before it (go build -o /tmp/old . at that commit); with -with-env, the two together")
	contended := flag.String("contended-rates", "", "also measure the steady load at these rates (e.g. 2000,10000) with a CPU burner of the bench's own busy on one core, for every system and the floors alike")
	burn := flag.Bool("burn", false, "internal: be the CPU burner (spin on one core until killed)")
	kafkaRTT := flag.Duration("kafka-rtt", 0, "outbox-cdc reaches Kafka through a proxy that adds this round trip (the broker's remote listener, as across a network; the bench's own clients connect directly)")
	flag.Parse()
	if *burn {
		burnForever()
	}
	var err error
	if c.rates, err = intList("rates", rates); err == nil {
		if c.payloads, err = intList("payloads", payloads); err == nil {
			c.txSizes, err = intList("tx-sizes", txSizes)
		}
	}
	if err == nil {
		c.contendedRates, err = intList("contended-rates", *contended)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if c.rate <= 0 {
		c.rates = nil
	} else if !slices.Contains(c.rates, c.rate) {
		c.rates = append(c.rates, c.rate)
	}
	slices.Sort(c.rates)
	env := devEnv()
	c.pgURL, c.brokers = env["OUTBOX_CDC_POSTGRES"], env["OUTBOX_CDC_BROKERS"]
	c.routerBrokers = c.brokers
	if *kafkaRTT > 0 {
		listener, advertised := env["OUTBOX_CDC_TEST_REMOTE_LISTENER"], env["OUTBOX_CDC_TEST_REMOTE_BROKERS"]
		if listener == "" || advertised == "" {
			fmt.Fprintln(os.Stderr, "bench: -kafka-rtt needs the broker's remote listener: run `make up` again (scripts/services.sh writes OUTBOX_CDC_TEST_REMOTE_* to .dev/env)")
			os.Exit(2)
		}
		proxy, err := faultnet.StartDelayed(advertised, listener, *kafkaRTT/2)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -kafka-rtt:", err)
			os.Exit(1)
		}
		defer proxy.Close()
		c.routerBrokers = advertised
		fmt.Printf("bench: outbox-cdc reaches Kafka through a proxy adding %v per round trip (%s to %s)\n", *kafkaRTT, advertised, listener)
	}
	if *fleetCounts != "" {
		counts, err := intList("fleet", *fleetCounts)
		if err == nil {
			var budgets []string
			for _, b := range strings.Split(*fleetBudget, ",") {
				if b = strings.TrimSpace(b); b != "" {
					budgets = append(budgets, b)
				}
			}
			err = runFleet(c, env["OUTBOX_CDC_TEST_ADMIN_POSTGRES"], counts, c.rate, c.events, budgets, *runs)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if sc.events > 0 {
		if sc.step <= 0 || sc.rate <= 0 || sc.minutes < 0 || sc.dur <= 0 {
			fmt.Fprintln(os.Stderr, "bench: -scale-step, -scale-rate and -scale-period must be positive, -scale-minutes at least 0")
			os.Exit(2)
		}
		if err := runScale(c, sc); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *writeCostEvents > 0 {
		if err := runWriteCost(c, env["OUTBOX_CDC_TEST_ADMIN_POSTGRES"], *writeCostEvents, *runs); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *inboxEvents > 0 {
		if err := runInbox(c, env["OUTBOX_CDC_TEST_ADMIN_POSTGRES"], *inboxEvents, *runs); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(c, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// intList parses a comma-separated list of positive integers.
func intList(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive integer", name, f)
		}
		out = append(out, n)
	}
	return out, nil
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
	for _, k := range []string{"OUTBOX_CDC_POSTGRES", "OUTBOX_CDC_BROKERS", "OUTBOX_CDC_TEST_ADMIN_POSTGRES", "OUTBOX_CDC_TEST_REMOTE_LISTENER", "OUTBOX_CDC_TEST_REMOTE_BROKERS"} {
		if v := os.Getenv(k); v != "" {
			out[k] = v
		}
	}
	return out
}

// systemMessages is outbox-cdc (at-least-once) reading the events as WAL messages of its target's
// prefix (messagePrefix) instead of rows.
const systemMessages = "outbox-cdc messages"

// systemEOS is outbox-cdc in exactly-once mode (kafka.delivery=exactly-once; read back read_committed).
const systemEOS = "outbox-cdc exactly-once"

// systems are the systems measured in each run, in this order: outbox-cdc (at-least-once), outbox-cdc
// in exactly-once mode, and Debezium with -compare.
func (c config) systems() []string {
	s := []string{"outbox-cdc", systemEOS}
	if c.hasAlt() {
		s = append(s, c.altSystem())
	}
	if c.messages {
		s = append(s, systemMessages)
	}
	if c.compare {
		s = append(s, systemDebezium, systemDebeziumTuned)
	}
	return s
}

// hasAlt reports whether -with-env or -with-binary adds a second outbox-cdc.
func (c config) hasAlt() bool { return c.altEnv != "" || c.altBinary != "" }

// altSystem names outbox-cdc run with -with-env and -with-binary.
func (c config) altSystem() string {
	var parts []string
	if c.altBinary != "" {
		parts = append(parts, filepath.Base(c.altBinary))
	}
	if c.altEnv != "" {
		parts = append(parts, c.altEnv)
	}
	return "outbox-cdc " + strings.Join(parts, " ")
}

func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
