package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// result is one run's figures.
type result struct {
	bytes         int64
	decodeCeiling time.Duration // pg_recvlogical over the same WAL
	kafkaCeiling  time.Duration // raw franz-go producer, same records
	systems       map[string]*measured
	floors        []floor // one per curve rate
	// contendedFloors are the floors at -contended-rates with the CPU burner running.
	contendedFloors []floor
	sweeps          struct{ payload, tx []sweepPoint }
}

// streamRate is a system's drain throughput from its first record to its last.
func streamRate(events int, m *measured) float64 { return perSecond(events, m.drain-m.firstRecord) }

// median returns the median of the values (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	sort.Float64s(v)
	return v[len(v)/2]
}

func run(c config, runs int) error {
	if c.pgURL == "" || c.brokers == "" {
		return errors.New("OUTBOX_CDC_POSTGRES / OUTBOX_CDC_BROKERS unknown: run `make up` first")
	}
	fmt.Printf("outbox-cdc benchmark, %s, %d cores %s/%s; PostgreSQL and Kafka on the same machine\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("drain: %d events, ~%d B JSON payload, COPY in transactions of %d rows; steady: %v events/s in transactions of %d, %s each\n",
		c.events, c.payload, c.txRows, c.rates, c.steadyRows, c.steadyFor)
	fmt.Printf("latency: from the moment a transaction's COMMIT is sent to a consumer's receipt of its record\n\n")
	systems := c.systems()
	var results []result
	for i := 1; i <= runs; i++ {
		r, err := once(c, i)
		if err != nil {
			return fmt.Errorf("run %d: %w", i, err)
		}
		fmt.Printf("run %d: decode ceiling %.0f ev/s, kafka ceiling %.0f ev/s\n", i, perSecond(c.events, r.decodeCeiling), perSecond(c.events, r.kafkaCeiling))
		for _, sys := range systems {
			m := r.systems[sys]
			fmt.Printf("  %-24s drain %.0f ev/s (first record after %s, all after %s), peak RSS %.1f MB, CPU %.2f s\n",
				sys, streamRate(c.events, m), m.firstRecord.Round(time.Millisecond), m.drain.Round(time.Millisecond),
				float64(m.peakRSSKB)/1024, m.cpu.Seconds())
			for _, l := range m.curve {
				fmt.Printf("    %s\n", l)
			}
			for _, l := range m.contended {
				fmt.Printf("    contended %s\n", l)
			}
		}
		for _, f := range r.floors {
			fmt.Printf("  floor decode %s\n  floor kafka  %s\n", f.decode, f.kafka)
		}
		for _, f := range r.contendedFloors {
			fmt.Printf("  contended floor decode %s\n  contended floor kafka  %s\n", f.decode, f.kafka)
		}
		results = append(results, r)
	}
	rep := report{c: c, systems: systems, results: results}
	rep.summary()
	rep.curve()
	rep.sweeps()
	if c.charts != "" {
		files, err := rep.charts(c.charts)
		if err != nil {
			return fmt.Errorf("charts: %w", err)
		}
		fmt.Printf("\ncharts: %s\n", strings.Join(files, ", "))
	}
	return nil
}

// String is one load point on one line.
func (l *latency) String() string {
	s := fmt.Sprintf("%6d ev/s (wrote %.0f/s): p50 %s p99 %s p99.9 %s", l.rate, l.achieved, ms(l.p50), ms(l.p99), ms(l.p999))
	if l.commits > 0 {
		s += fmt.Sprintf(", %.0f Kafka transactions/s", l.commits)
	}
	if l.behind {
		s += fmt.Sprintf(" BEHIND (saw %d of %d)", l.seen, l.sent)
	}
	return s
}

// report prints medians over runs.
type report struct {
	c       config
	systems []string
	results []result
}

func (r report) med(f func(result) float64) float64 {
	v := make([]float64, 0, len(r.results))
	for _, res := range r.results {
		v = append(v, f(res))
	}
	return median(v)
}

func (r report) sysMed(sys string, f func(*measured) float64) float64 {
	return r.med(func(res result) float64 { return f(res.systems[sys]) })
}

// point is the median of a latency quantile at a rate over the runs that reached the rate; behind
// when any run fell behind there or never got there.
func (r report) point(rate int, get func(result) *latency, q func(*latency) time.Duration) (float64, bool) {
	var v []float64
	behind := false
	for _, res := range r.results {
		l := get(res)
		if l == nil || l.behind {
			behind = true
			if l == nil {
				continue
			}
		}
		v = append(v, msf(q(l)))
	}
	return median(v), behind
}

func (r report) summary() {
	c := r.c
	bytesPerRun := r.results[0].bytes
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
		at := func(f func(*latency) float64) func(*measured) float64 {
			return func(m *measured) float64 {
				if l := m.at(c.rate); l != nil && !l.behind {
					return f(l)
				}
				return -1
			}
		}
		rows = append(rows,
			row{fmt.Sprintf("steady latency p50 at %d events/s (ms)", c.rate), at(func(l *latency) float64 { return msf(l.p50) }), "%.1f"},
			row{fmt.Sprintf("steady latency p99 at %d events/s (ms)", c.rate), at(func(l *latency) float64 { return msf(l.p99) }), "%.1f"},
			row{fmt.Sprintf("steady latency p99.9 at %d events/s (ms)", c.rate), at(func(l *latency) float64 { return msf(l.p999) }), "%.1f"},
			row{"steady: confirmed_flush_lsn trails the WAL, median (bytes)", at(func(l *latency) float64 { return float64(l.trailMed) }), "%.0f"},
			row{"steady: confirmed_flush_lsn trails the WAL, max (bytes)", at(func(l *latency) float64 { return float64(l.trailMax) }), "%.0f"},
		)
	}
	// Ratios of medians, each pair measured side by side in the same runs.
	at := func(name string) int { return slices.Index(r.systems, name) }
	ratios := [][2]int{{1, 0}} // exactly-once / at-least-once
	if c.hasAlt() {
		ratios = append(ratios, [2]int{0, at(c.altSystem())})
	}
	if c.compare {
		ratios = append(ratios, [2]int{0, at(systemDebezium)}, [2]int{0, at(systemDebeziumTuned)})
	}
	fmt.Printf("\nmedians of %d runs\n\n| figure | %s |", len(r.results), strings.Join(r.systems, " | "))
	for _, q := range ratios {
		fmt.Printf(" %s / %s |", r.systems[q[0]], r.systems[q[1]])
	}
	fmt.Printf("\n|---|%s%s\n", strings.Repeat("---|", len(r.systems)), strings.Repeat("---|", len(ratios)))
	for _, row := range rows {
		fmt.Printf("| %s |", row.name)
		var vals []float64
		for _, sys := range r.systems {
			v := r.sysMed(sys, row.f)
			vals = append(vals, v)
			if v < 0 && strings.Contains(row.name, "steady") {
				fmt.Printf(" behind |")
				continue
			}
			fmt.Printf(" "+row.unit+" |", v)
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
	decode := r.med(func(res result) float64 { return perSecond(c.events, res.decodeCeiling) })
	kafka := r.med(func(res result) float64 { return perSecond(c.events, res.kafkaCeiling) })
	fmt.Printf("\nceilings on the same data: pg_recvlogical (decode) %.0f events/s, raw franz-go producer (Kafka) %.0f events/s\n", decode, kafka)
	for _, sys := range r.systems {
		v := r.sysMed(sys, func(m *measured) float64 { return streamRate(c.events, m) })
		fmt.Printf("%s / decode ceiling %.2f, / Kafka ceiling %.2f\n", sys, v/decode, v/kafka)
	}
}

// curveSeries is one line of the latency curve: a system or a floor.
type curveSeries struct {
	name string
	get  func(result, int) *latency
}

func (r report) curveSeries(contended bool) []curveSeries {
	var out []curveSeries
	for _, sys := range r.systems {
		out = append(out, curveSeries{sys, func(res result, rate int) *latency {
			if contended {
				return pointAt(res.systems[sys].contended, rate)
			}
			return res.systems[sys].at(rate)
		}})
	}
	floorAt := func(f func(floor) *latency) func(result, int) *latency {
		return func(res result, rate int) *latency {
			floors := res.floors
			if contended {
				floors = res.contendedFloors
			}
			for _, fl := range floors {
				if fl.decode.rate == rate {
					return f(fl)
				}
			}
			return nil
		}
	}
	out = append(out,
		curveSeries{"floor: commit → decoded", floorAt(func(f floor) *latency { return f.decode })},
		curveSeries{"floor: produce → consumed", floorAt(func(f floor) *latency { return f.kafka })},
		curveSeries{"floor: sum", floorAt(func(f floor) *latency { s := f.sum(); return &s })},
	)
	return out
}

var quantiles = []struct {
	name string
	q    func(*latency) time.Duration
}{
	{"p50", func(l *latency) time.Duration { return l.p50 }},
	{"p99", func(l *latency) time.Duration { return l.p99 }},
	{"p99.9", func(l *latency) time.Duration { return l.p999 }},
}

func (r report) curve() {
	if len(r.c.rates) > 0 {
		fmt.Printf("\nsteady latency p50 / p99 / p99.9 (ms), medians of %d runs; \"behind\": the system did not keep up\n\n", len(r.results))
		r.printCurve(r.c.rates, r.curveSeries(false))
	}
	if len(r.c.contendedRates) > 0 {
		fmt.Printf("\nunder contention (the bench's CPU burner busy on one core for every column and floor alike): steady latency p50 / p99 / p99.9 (ms), medians of %d runs\n\n", len(r.results))
		r.printCurve(r.c.contendedRates, r.curveSeries(true))
	}
}

// printCurve prints one latency table: a row per rate, a column per series, and outbox-cdc's p50
// and p99 against the floor's sum and (with -compare) tuned Debezium's, and exactly-once's against
// at-least-once's.
func (r report) printCurve(rates []int, series []curveSeries) {
	tuned := slices.IndexFunc(series, func(s curveSeries) bool { return s.name == systemDebeziumTuned })
	eos := slices.IndexFunc(series, func(s curveSeries) bool { return s.name == systemEOS })
	fmt.Printf("| events/s |")
	for _, s := range series {
		fmt.Printf(" %s |", s.name)
	}
	fmt.Printf(" outbox-cdc / floor sum (p50 / p99) |")
	if tuned >= 0 {
		fmt.Printf(" outbox-cdc / Debezium tuned (p50 / p99) |")
	}
	if eos >= 0 {
		fmt.Printf(" exactly-once / outbox-cdc (p50 / p99) |")
	}
	fmt.Printf("\n|---|%s---|", strings.Repeat("---|", len(series)))
	if tuned >= 0 {
		fmt.Printf("---|")
	}
	if eos >= 0 {
		fmt.Printf("---|")
	}
	fmt.Println()
	ratio := func(rate int, num, den curveSeries) string {
		var ratio []string
		for _, q := range quantiles[:2] {
			n, b1 := r.point(rate, func(res result) *latency { return num.get(res, rate) }, q.q)
			d, b2 := r.point(rate, func(res result) *latency { return den.get(res, rate) }, q.q)
			if b1 || b2 || d <= 0 {
				ratio = append(ratio, "-")
			} else {
				ratio = append(ratio, fmt.Sprintf("%.2f", n/d))
			}
		}
		return strings.Join(ratio, " / ")
	}
	for _, rate := range rates {
		fmt.Printf("| %d |", rate)
		for _, s := range series {
			var parts []string
			for _, q := range quantiles {
				get := func(res result) *latency { return s.get(res, rate) }
				v, behind := r.point(rate, get, q.q)
				if behind {
					parts = []string{"behind"}
					break
				}
				parts = append(parts, fmt.Sprintf("%.1f", v))
			}
			fmt.Printf(" %s |", strings.Join(parts, " / "))
		}
		fmt.Printf(" %s |", ratio(rate, series[0], series[len(series)-1]))
		if tuned >= 0 {
			fmt.Printf(" %s |", ratio(rate, series[0], series[tuned]))
		}
		if eos >= 0 {
			fmt.Printf(" %s |", ratio(rate, series[eos], series[0]))
		}
		fmt.Println()
	}
}

func (r report) sweeps() {
	if len(r.results[0].sweeps.payload) > 0 {
		fmt.Printf("\noutbox-cdc drain by payload size (transactions of %d rows), medians of %d runs\n\n| payload (B) | events | events/s | MB/s | CPU µs/event | peak RSS (MB) |\n|---|---|---|---|---|---|\n", r.c.txRows, len(r.results))
		for i, p := range r.results[0].sweeps.payload {
			r.sweepRow(fmt.Sprint(p.payload), p.events, func(res result) sweepPoint { return res.sweeps.payload[i] })
		}
	}
	if len(r.results[0].sweeps.tx) > 0 {
		fmt.Printf("\noutbox-cdc drain by transaction size (payload ~%d B), medians of %d runs\n\n| rows per transaction | events | events/s | MB/s | CPU µs/event | peak RSS (MB) |\n|---|---|---|---|---|---|\n", r.c.payload, len(r.results))
		for i, p := range r.results[0].sweeps.tx {
			r.sweepRow(fmt.Sprint(p.txRows), p.events, func(res result) sweepPoint { return res.sweeps.tx[i] })
		}
	}
}

func (r report) sweepRow(label string, events int, get func(result) sweepPoint) {
	m := func(f func(sweepPoint) float64) float64 {
		return r.med(func(res result) float64 { return f(get(res)) })
	}
	fmt.Printf("| %s | %d | %.0f | %.1f | %.1f | %.1f |\n", label, events,
		m(sweepPoint.eventsPerSec), m(sweepPoint.mbPerSec), m(sweepPoint.cpuPerEvent),
		m(func(p sweepPoint) float64 { return float64(p.peakRSSKB) / 1024 }))
}

// charts writes the SVG charts and returns their paths.
func (r report) charts(dir string) ([]string, error) {
	var files []string
	write := func(name string, ch chart) error {
		path := filepath.Join(dir, name)
		if err := ch.write(path); err != nil {
			return err
		}
		files = append(files, path)
		return nil
	}
	if len(r.c.rates) > 0 {
		for _, q := range quantiles[:2] {
			ch := chart{title: "steady latency " + q.name + " (ms) by load, medians of " + fmt.Sprint(len(r.results)) + " runs",
				xLabel: "events/s", yLabel: q.name + " ms", logX: true, logY: true}
			for _, s := range r.curveSeries(false) {
				if s.name == "floor: commit → decoded" || s.name == "floor: produce → consumed" {
					continue
				}
				var pts [][2]float64
				for _, rate := range r.c.rates {
					if v, behind := r.point(rate, func(res result) *latency { return s.get(res, rate) }, q.q); !behind && v > 0 {
						pts = append(pts, [2]float64{float64(rate), v})
					}
				}
				ch.series = append(ch.series, series{name: s.name, points: pts})
			}
			if err := write("latency-"+strings.ReplaceAll(q.name, ".", "")+".svg", ch); err != nil {
				return nil, err
			}
		}
	}
	sweep := func(name, title, xLabel string, get func(result) []sweepPoint, x func(sweepPoint) float64) error {
		if len(get(r.results[0])) == 0 {
			return nil
		}
		ev := series{name: "events/s (thousands)"}
		cpu := series{name: "CPU µs per event"}
		for i, p := range get(r.results[0]) {
			m := func(f func(sweepPoint) float64) float64 {
				return r.med(func(res result) float64 { return f(get(res)[i]) })
			}
			ev.points = append(ev.points, [2]float64{x(p), m(sweepPoint.eventsPerSec) / 1000})
			cpu.points = append(cpu.points, [2]float64{x(p), m(sweepPoint.cpuPerEvent)})
		}
		return write(name, chart{title: title, xLabel: xLabel, yLabel: "", logX: true, logY: true, series: []series{ev, cpu}})
	}
	if err := sweep("throughput-payload.svg", "outbox-cdc drain by payload size", "payload bytes",
		func(res result) []sweepPoint { return res.sweeps.payload }, func(p sweepPoint) float64 { return float64(p.payload) }); err != nil {
		return nil, err
	}
	if err := sweep("throughput-txsize.svg", "outbox-cdc drain by transaction size", "rows per transaction",
		func(res result) []sweepPoint { return res.sweeps.tx }, func(p sweepPoint) float64 { return float64(p.txRows) }); err != nil {
		return nil, err
	}
	return files, nil
}
