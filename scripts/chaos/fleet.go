package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/freeport"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// fleetInstances is how many outbox-cdc processes share the sources in the fleet mode.
const fleetInstances = 3

var fleetActiveRE = regexp.MustCompile(`(?m)^outbox_cdc_role\{role="active",source="([^"]+)"\} 1$`)

// fleetProc is one instance of the fleet.
type fleetProc struct {
	*routerProc
	metrics string
	lists   map[string]bool // the sources its configuration lists
}

// active returns the sources the instance streams (none when it does not answer).
func (p *fleetProc) active() []string {
	select {
	case <-p.done:
		return nil
	default:
	}
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out []string
	for _, m := range fleetActiveRE.FindAllStringSubmatch(string(body), -1) {
		out = append(out, m[1])
	}
	return out
}

// runFleet is the fleet mode: n sources (tables of the local database; the first with a second
// outbox table in its tables list) shared by three instances through the consumer group, written to
// all the while, and an instance killed (SIGKILL, or SIGTERM one time in four) and replaced every
// o.every. Half way through, a rolling configuration change begins: the last source is removed (its
// writers stop and it is caught up first) and a new one added (its slot made at the start, its writers
// on from the start), and every replacement from then on runs the new list beside the old instances
// still alive. Each time it measures how long until every source a live instance lists streams on
// exactly one of them; at the end it checks every source's events as the single-router mode does.
func runFleet(ctx context.Context, o options, n int) (bool, error) {
	e, err := env()
	if err != nil {
		return false, err
	}
	id := fmt.Sprintf("%x", time.Now().Unix())
	if err := os.MkdirAll(".dev/chaos", 0o755); err != nil {
		return false, err
	}
	per := o
	per.rate = max(o.rate/n, 2)
	var sources []*suite
	var extra *suite // s0's second outbox table
	var entries []string
	for i := range n + 1 { // the last one is added in the rolling change
		s := &suite{o: per, pgURL: e["OUTBOX_CDC_POSTGRES"], adminURL: e["OUTBOX_CDC_TEST_ADMIN_POSTGRES"], brokers: strings.Split(e["OUTBOX_CDC_BROKERS"], ","),
			table: fmt.Sprintf("public.chaos_%s_%d", id, i), pub: fmt.Sprintf("chaos_%s_%d", id, i), slot: fmt.Sprintf("chaos_%s_%d", id, i),
			pfx: fmt.Sprintf("chaos-%s-%d", id, i), faults: map[string]int{}}
		if err := s.setup(ctx); err != nil {
			return false, err
		}
		defer s.cleanup()
		sources = append(sources, s)
		tables := ""
		if i == 0 {
			// s0 holds a second outbox table (its tables list), through its slot and publication.
			x := &suite{o: per, pgURL: s.pgURL, adminURL: s.adminURL, brokers: s.brokers,
				table: s.table + "_b", pub: s.pub + "_b", slot: s.slot,
				pfx: s.pfx + "-b", faults: map[string]int{}}
			if err := x.setup(ctx); err != nil {
				return false, err
			}
			defer x.cleanup()
			if err := x.admin(ctx, func(c *pgx.Conn) error {
				_, err := c.Exec(ctx, "ALTER PUBLICATION "+s.pub+" ADD TABLE "+x.table)
				return err
			}); err != nil {
				return false, err
			}
			tables = fmt.Sprintf(", tables: [{table: %s, routing: {topic: %q}}]", x.table, x.pfx+".{event_type}")
			extra = x
		}
		entries = append(entries, fmt.Sprintf("  - {name: s%d, postgres: {url: %q, table: %s, slot: %s, publication: %s}, routing: {topic: %q}%s}\n",
			i, s.pgURL, s.table, s.slot, s.pub, s.pfx+".{event_type}", tables))
	}
	// The added source's slot exists from the start (as init makes it), so that what is written
	// before an instance with the new list streams it waits in the slot.
	added, removed := sources[n], sources[n-1]
	if err := added.admin(ctx, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, added.slot)
		return err
	}); err != nil {
		return false, err
	}
	// Written and checked like a source of its own.
	written := append(slices.Clone(sources), extra)
	names := func(list []int) map[string]bool {
		m := map[string]bool{}
		for _, i := range list {
			m[fmt.Sprintf("s%d", i)] = true
		}
		return m
	}
	var oldList, newList []int
	for i := range n {
		oldList = append(oldList, i)
		if i != n-1 {
			newList = append(newList, i)
		}
	}
	newList = append(newList, n)
	writeConfig := func(name string, list []int) (string, error) {
		var b strings.Builder
		for _, i := range list {
			b.WriteString(entries[i])
		}
		path := filepath.Join(".dev/chaos", id+"."+name+".yaml")
		doc := fmt.Sprintf(`kafka: {brokers: [%q], delivery: %s, checkpoint_topic: chaos-%s.checkpoints, record_timestamp: produce}
postgres: {status_interval: 2s, receive_timeout: 5s, standby_poll_interval: 500ms}
log: {format: json}
shutdown_timeout: 10s
fleet: {session_timeout: 6s, group: chaos-%s}
sources:
%s`, strings.Join(sources[0].brokers, ","), o.delivery, id, id, b.String())
		return path, os.WriteFile(path, []byte(doc), 0o600)
	}
	oldCfg, err := writeConfig("fleet-old", oldList)
	if err != nil {
		return false, err
	}
	newCfg, err := writeConfig("fleet-new", newList)
	if err != nil {
		return false, err
	}
	cfgFile, listed := oldCfg, names(oldList)
	logPath := filepath.Join(".dev/chaos", id+".fleet.log")
	start := func() (*fleetProc, error) {
		port, err := freeport.Loopback()
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(o.binary, "run", "--config", cfgFile)
		cmd.Env = append(os.Environ(), "OUTBOX_CDC_METRICS_ADDR="+addr)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			logFile.Close()
			return nil, err
		}
		r := &routerProc{cmd: cmd, done: make(chan struct{})}
		go func() {
			_ = cmd.Wait()
			logFile.Close()
			close(r.done)
		}()
		return &fleetProc{routerProc: r, metrics: addr, lists: listed}, nil
	}
	var live []*fleetProc
	defer func() {
		for _, p := range live {
			p.stop(syscall.SIGKILL)
		}
	}()
	for range fleetInstances {
		p, err := start()
		if err != nil {
			return false, err
		}
		live = append(live, p)
	}
	// allStreaming waits until every source a live instance lists streams on exactly one of them.
	allStreaming := func(timeout time.Duration) (time.Duration, bool) {
		began := time.Now()
		for time.Since(began) < timeout && ctx.Err() == nil {
			want := map[string]bool{}
			seen := map[string]int{}
			for _, p := range live {
				for name := range p.lists {
					want[name] = true
				}
				for _, s := range p.active() {
					seen[s]++
				}
			}
			ok := len(seen) == len(want)
			for name := range want {
				ok = ok && seen[name] == 1
			}
			if ok {
				return time.Since(began), true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(began), false
	}
	if _, ok := allStreaming(time.Minute); !ok {
		return false, fmt.Errorf("the fleet did not stream every source within a minute (log: %s)", logPath)
	}

	began := time.Now()
	wctx, stopWriters := context.WithCancel(ctx)
	rctx, stopRemoved := context.WithCancel(wctx) // the removed source's writers stop at the change
	defer stopRemoved()
	var writers sync.WaitGroup
	for _, s := range written {
		s.newLedger()
		for w := range 2 {
			writers.Add(1)
			go func() {
				defer writers.Done()
				if s == removed {
					s.write(rctx, w)
				} else {
					s.write(wctx, w)
				}
			}()
		}
	}
	rolled := false
	var rollout string
	faults := map[string]int{}
	var takeovers []time.Duration
	unrecovered := 0
	for ctx.Err() == nil && time.Since(began) < o.duration {
		select {
		case <-ctx.Done():
		case <-time.After(o.every):
		}
		if ctx.Err() != nil {
			break
		}
		i := rand.IntN(len(live))
		kind, sig := "kill", syscall.SIGKILL
		if rand.IntN(4) == 0 {
			kind, sig = "term", syscall.SIGTERM
		}
		if !rolled && time.Since(began) > o.duration/2 {
			// The rolling change: the removed source's last events are delivered first (nothing
			// streams it once the old instances are gone), then replacements run the new list.
			rolled = true
			stopRemoved()
			if err := removed.waitCaughtUp(ctx, removed.currentLSN(ctx), o.recoverWait); err != nil {
				rollout = "the removed source did not catch up before the change: " + err.Error()
			}
			cfgFile, listed = newCfg, names(newList)
		}
		// Once the change began, the instances still on the old list go first.
		for j, p := range live {
			if rolled && p.lists[fmt.Sprintf("s%d", n-1)] {
				i = j
				break
			}
		}
		live[i].stop(sig)
		live = slices.Delete(live, i, i+1)
		faults[kind]++
		took, ok := allStreaming(time.Minute)
		if !ok {
			unrecovered++
		}
		takeovers = append(takeovers, took)
		p, err := start() // the replacement joins and takes its share
		if err != nil {
			stopWriters()
			return false, err
		}
		live = append(live, p)
	}
	stopWriters()
	writers.Wait()
	oldLeft := 0
	for _, p := range live {
		if p.lists[fmt.Sprintf("s%d", n-1)] {
			oldLeft++
		}
	}

	var total struct{ events, missing, violations, wrong, dups int }
	var problems []string
	if rollout != "" {
		problems = append(problems, rollout)
	}
	caughtUp := rollout == ""
	for _, s := range written {
		if s == removed && oldLeft == 0 {
			continue // caught up before the change; nothing streams it any more
		}
		if err := s.waitCaughtUp(context.Background(), s.currentLSN(context.Background()), o.recoverWait); err != nil {
			caughtUp = false
			problems = append(problems, s.pfx+": "+err.Error())
		}
		var want []testenv.Event
		for _, evs := range s.committed {
			want = append(want, evs...)
		}
		rep := testenv.CheckDelivery(s.pfx, want, s.consume(want))
		total.events += rep.Events
		total.missing += rep.Missing
		total.violations += rep.OrderViolations
		total.wrong += rep.Wrong
		total.dups += rep.Duplicates
		problems = append(problems, rep.Problems...)
	}
	slices.Sort(takeovers)
	median, worst := time.Duration(0), time.Duration(0)
	if k := len(takeovers); k > 0 {
		median, worst = takeovers[k/2], takeovers[k-1]
	}
	fmt.Printf("chaos fleet: delivery=%s sources=%d(+1 added, 1 removed) tables=%d instances=%d events=%d lost=%d order_violations=%d wrong=%d duplicates=%d faults=kill:%d,term:%d takeover_median=%s takeover_max=%s unrecovered=%d rolled=%t old_instances_left=%d duration=%s\n",
		o.delivery, n, len(written), fleetInstances, total.events, total.missing, total.violations, total.wrong, total.dups, faults["kill"], faults["term"],
		median.Round(10*time.Millisecond), worst.Round(10*time.Millisecond), unrecovered, rolled, oldLeft, time.Since(began).Round(time.Second))
	for i, p := range problems {
		if i == 20 {
			fmt.Printf("  ... %d more\n", len(problems)-20)
			break
		}
		fmt.Println("  " + p)
	}
	ok := total.missing == 0 && total.violations == 0 && total.wrong == 0 && unrecovered == 0 && caughtUp && rolled
	if o.delivery == "exactly-once" && total.dups > 0 {
		fmt.Printf("  exactly-once: a read_committed consumer saw %d duplicates\n", total.dups)
		ok = false
	}
	if !ok {
		fmt.Println("  log: " + logPath)
	}
	return ok, nil
}
