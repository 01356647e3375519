package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// fleetRow is what one process with n sources measured.
type fleetRow struct {
	sources                 int
	idleRSS, loadRSS        float64 // MB: VmRSS after the idle period, VmHWM after the load
	conns, walsenders       int     // the router's PostgreSQL connections while idle
	idleCPU, loadCPU        float64 // share of one core
	ready                   time.Duration
	drainEvents             int
	drainBusy               int
	drainRate, drainSeconds float64
}

// runFleet measures one process streaming n sources for each n of counts (each source its own table,
// publication and slot in the bench database): RSS, PostgreSQL connections and CPU while idle and
// under a steady load spread over the sources; then the drain of one backlog held by 1 source against
// the same backlog spread over 4.
func runFleet(c config, adminURL string, counts []int, rate int, drainEvents int, budgets []string, runs int) error {
	ctx := context.Background()
	var rows []fleetRow
	for _, n := range counts {
		row, err := fleetOnce(ctx, c, adminURL, n, rate, 0, "")
		if err != nil {
			return fmt.Errorf("%d sources: %w", n, err)
		}
		rows = append(rows, row)
	}
	var drains []fleetRow
	for _, busy := range []int{1, 4} {
		row, err := fleetOnce(ctx, c, adminURL, busy, 0, drainEvents, "")
		if err != nil {
			return fmt.Errorf("drain over %d sources: %w", busy, err)
		}
		drains = append(drains, row)
	}
	if len(budgets) > 0 {
		if err := fleetBudgets(ctx, c, adminURL, drainEvents, budgets, runs); err != nil {
			return err
		}
	}
	fmt.Printf("fleet: one process, n sources (each its own table, publication and slot); idle for 10 s, then %d events/s spread over the sources for 10 s\n\n", rate)
	fmt.Println("| sources | all ready after (s) | RSS idle (MB) | RSS per source idle (MB) | PostgreSQL connections (walsenders) | CPU idle (% of a core) | peak RSS under load (MB) | CPU under load (% of a core) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	base := rows[0]
	for _, r := range rows {
		per := "–"
		if r.sources > base.sources {
			per = fmt.Sprintf("%.2f", (r.idleRSS-base.idleRSS)/float64(r.sources-base.sources))
		}
		fmt.Printf("| %d | %.1f | %.1f | %s | %d (%d) | %.1f | %.1f | %.1f |\n", r.sources, r.ready.Seconds(), r.idleRSS, per, r.conns, r.walsenders, 100*r.idleCPU, r.loadRSS, 100*r.loadCPU)
	}
	fmt.Printf("\naggregate drain: %d events (~%d B payload) written beforehand, then the process started\n\n", drainEvents, c.payload)
	fmt.Println("| busy sources | drain (events/s) | first to last record (s) | peak RSS (MB) |")
	fmt.Println("|---|---|---|---|")
	for _, d := range drains {
		fmt.Printf("| %d | %.0f | %.2f | %.1f |\n", d.drainBusy, d.drainRate, d.drainSeconds, d.loadRSS)
	}
	if len(drains) == 2 && drains[0].drainRate > 0 {
		fmt.Printf("\n4 busy sources / 1: %.2f\n", drains[1].drainRate/drains[0].drainRate)
	}
	return nil
}

// fleetOnce runs one process over n fresh sources: with drain > 0, drain events written beforehand
// spread over them, timed; otherwise the idle and load measurements.
func fleetOnce(ctx context.Context, c config, adminURL string, n, rate, drain int, budget string) (row fleetRow, err error) {
	row = fleetRow{sources: n, drainBusy: n, drainEvents: drain}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return row, err
	}
	defer admin.Close(ctx)
	script, err := os.ReadFile(filepath.Join("sql", "outbox.sql"))
	if err != nil {
		return row, err
	}
	id := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	routerURL := c.pgURL
	var entries strings.Builder
	tables := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("bf_%s_%d", id, i)
		tables[i] = "public." + name
		sql := strings.ReplaceAll(string(script), "public.outbox", tables[i])
		sql = strings.ReplaceAll(sql, "'outbox_cdc'", "'pub_"+name+"'")
		sql = strings.ReplaceAll(sql, "PUBLICATION outbox_cdc", "PUBLICATION pub_"+name)
		if _, err := admin.Exec(ctx, sql); err != nil {
			return row, fmt.Errorf("create %s: %w", tables[i], err)
		}
		if _, err := admin.Exec(ctx, "ALTER TABLE "+quoted(tables[i])+" OWNER TO "+pgx.Identifier{routerUser(routerURL)}.Sanitize()); err != nil {
			return row, err
		}
		fmt.Fprintf(&entries, "  - {name: s%d, postgres: {url: %q, table: %s, slot: slot_%s, publication: pub_%s}, routing: {topic: \"bench.fleet.%s.{event_type}\"}}\n",
			i, routerURL, tables[i], name, name, id)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := range n {
			name := fmt.Sprintf("bf_%s_%d", id, i)
			_, _ = admin.Exec(cctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, "slot_"+name)
			for try := 0; try < 50; try++ {
				if _, err := admin.Exec(cctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, "slot_"+name); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			_, _ = admin.Exec(cctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{"pub_" + name}.Sanitize())
			_, _ = admin.Exec(cctx, "DROP TABLE IF EXISTS "+quoted(tables[i]))
		}
	}()
	if drain > 0 {
		// The backlog waits for the slots: create them first (the router would create them at start).
		for i := range n {
			if _, err := admin.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, fmt.Sprintf("slot_bf_%s_%d", id, i)); err != nil {
				return row, err
			}
		}
		records := makeRecords(drain, c.payload)
		per := (drain + n - 1) / n
		for i := range n {
			part := records[min(i*per, drain):min((i+1)*per, drain)]
			for start := 0; start < len(part); start += c.txRows {
				chunk := part[start:min(start+c.txRows, len(part))]
				if _, err := admin.CopyFrom(ctx, pgx.Identifier{"public", strings.TrimPrefix(tables[i], "public.")},
					columns, pgx.CopyFromRows(chunk)); err != nil {
					return row, fmt.Errorf("write the backlog: %w", err)
				}
			}
		}
	}
	port, err := freePort()
	if err != nil {
		return row, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfgFile := filepath.Join(os.TempDir(), "bench-fleet-"+id+".yaml")
	doc := fmt.Sprintf("kafka: {brokers: [%q]}\nlog: {level: warn}\nmetrics: {addr: %q}\nsources:\n%s", c.brokers, addr, entries.String())
	if err := os.WriteFile(cfgFile, []byte(doc), 0o600); err != nil {
		return row, err
	}
	defer os.Remove(cfgFile)
	cmd := exec.Command(c.binary, "run", "--config", cfgFile)
	cmd.Stderr = os.Stderr
	if budget != "" {
		cmd.Env = append(os.Environ(), "OUTBOX_CDC_FLEET_MAX_INFLIGHT_BYTES="+budget)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return row, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	if drain > 0 {
		var first time.Time
		for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			got := producedTotal(addr)
			if got > 0 && first.IsZero() {
				first = time.Now()
			}
			if got >= drain {
				row.drainSeconds = time.Since(first).Seconds()
				row.drainRate = float64(drain) / row.drainSeconds
				row.loadRSS = float64(peakRSS(pid)) / 1024
				return row, nil
			}
		}
		return row, fmt.Errorf("the drain did not end within 10 minutes (%d of %d)", producedTotal(addr), drain)
	}
	for deadline := time.Now().Add(2*time.Minute + time.Duration(n)*time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, m := get(addr, "/metrics"); len(activeRE.FindAllString(m, -1)) == n {
			break
		}
		if time.Now().After(deadline) {
			_, body := get(addr, "/readyz")
			return row, fmt.Errorf("not every source ready: %s", body)
		}
	}
	row.ready = time.Since(started)
	time.Sleep(5 * time.Second) // settle
	cpu0 := cpuTime(pid)
	time.Sleep(10 * time.Second)
	row.idleCPU = (cpuTime(pid) - cpu0).Seconds() / 10
	row.idleRSS = float64(currentRSS(pid)) / 1024
	if err := admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE backend_type = 'walsender') FROM pg_stat_activity WHERE usename = $1`,
		routerUser(routerURL)).Scan(&row.conns, &row.walsenders); err != nil {
		return row, err
	}
	// Load: rate events/s in transactions of 10 rows, round robin over the sources, for 10 s.
	cpu0 = cpuTime(pid)
	writer, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return row, err
	}
	defer writer.Close(ctx)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	perTick := max(rate/100, 1)
	records := makeRecords(perTick, c.payload)
	for i, end := 0, time.Now().Add(10*time.Second); time.Now().Before(end); i++ {
		<-tick.C
		tbl := tables[i%n]
		batch := &pgx.Batch{}
		for _, r := range records {
			batch.Queue("INSERT INTO "+quoted(tbl)+" (event_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload) VALUES (gen_random_uuid(), $1, $2, $3, $4, $5)", r[1:6]...)
		}
		if err := writer.SendBatch(ctx, batch).Close(); err != nil {
			return row, fmt.Errorf("load: %w", err)
		}
	}
	row.loadCPU = (cpuTime(pid) - cpu0).Seconds() / 10
	row.loadRSS = float64(peakRSS(pid)) / 1024
	return row, nil
}

// routerUser is the user name of a PostgreSQL URL.
func routerUser(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		if at := strings.IndexByte(rest, '@'); at >= 0 {
			user, _, _ := strings.Cut(rest[:at], ":")
			return user
		}
	}
	return ""
}

var activeRE = regexp.MustCompile(`(?m)^outbox_cdc_role\{role="active",source="[^"]+"\} 1$`)

var producedRE = regexp.MustCompile(`(?m)^outbox_cdc_events_produced_total\{[^}]*\} ([0-9.e+]+)$`)

// producedTotal sums the router's events_produced_total over every source and topic.
func producedTotal(addr string) int {
	_, body := get(addr, "/metrics")
	total := 0.0
	for _, m := range producedRE.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		total += v
	}
	return int(total)
}

func get(addr, path string) (int, string) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// currentRSS reads VmRSS (the resident set now) of a process, in kB.
func currentRSS(pid int) int64 { return procStatusKB(pid, "VmRSS:") }

// quoted is a schema.table name as a quoted identifier.
func quoted(table string) string {
	schema, name, _ := strings.Cut(table, ".")
	return pgx.Identifier{schema, name}.Sanitize()
}

// fleetBudgets drains the backlog over 4 busy sources with each process-wide in-flight budget
// (fleet.max_inflight_bytes) in turn, runs times, and prints the medians side by side: the drain and
// the peak RSS each budget gives.
func fleetBudgets(ctx context.Context, c config, adminURL string, drain int, budgets []string, runs int) error {
	type result struct{ rates, rss []float64 }
	res := make([]result, len(budgets))
	for run := range runs {
		for i, b := range budgets {
			row, err := fleetOnce(ctx, c, adminURL, 4, 0, drain, b)
			if err != nil {
				return fmt.Errorf("drain over 4 sources with fleet.max_inflight_bytes %s: %w", b, err)
			}
			res[i].rates = append(res[i].rates, row.drainRate)
			res[i].rss = append(res[i].rss, row.loadRSS)
			fmt.Fprintf(os.Stderr, "bench: run %d, budget %s: %.0f events/s, peak RSS %.1f MB\n", run+1, b, row.drainRate, row.loadRSS)
		}
	}
	fmt.Printf("\nprocess-wide in-flight budget: %d events over 4 busy sources, medians of %d runs, side by side\n\n", drain, runs)
	fmt.Println("| fleet.max_inflight_bytes | drain (events/s) | ratio | peak RSS (MB) | runs (MB) |")
	fmt.Println("|---|---|---|---|---|")
	base := median(res[0].rates)
	for i, b := range budgets {
		fmt.Printf("| %s | %.0f | %.2f | %.1f | %v |\n", b, median(res[i].rates), median(res[i].rates)/base, median(res[i].rss), res[i].rss)
	}
	return nil
}
