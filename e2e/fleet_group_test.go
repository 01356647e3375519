package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// fleetInstance is one outbox-cdc process of a fleet test.
type fleetInstance struct {
	r    *routerProc
	addr string
}

var activeRE = regexp.MustCompile(`(?m)^outbox_cdc_role\{role="active",source="([^"]+)"\} 1$`)

// active returns the sources the instance streams, from its metrics (nil when it does not answer).
func (in *fleetInstance) active(t *testing.T) []string {
	select {
	case <-in.r.done:
		return nil
	default:
	}
	// Not httpGet: an instance that is starting or gone does not answer, which is not a failure here.
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + in.addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		return nil
	}
	body := string(data)
	var out []string
	for _, m := range activeRE.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

// TestFleetSharesSources: three instances started with one sources list of eight sources (seven
// databases, one of them with a second outbox table; and src1 with a second table of its own in its
// tables list) share them through the consumer group, with a
// writer on every source all along: every source streams on exactly one instance within 60 s, spread
// evenly; after an instance is SIGKILLed its sources stream again on the others (the time is logged;
// the goal is 15 s); a new instance takes its share; an instance stopped with SIGTERM hands its
// sources over and exits 0; ownership is balanced after each change. One source's database stopped:
// the other seven keep streaming and stay ready. Every event of every source arrives, in order.
func TestFleetSharesSources(t *testing.T) {
	const nSources = 8
	types := []string{"Placed", "Shipped"}
	var (
		fixtures [nSources]*testenv.Fixture
		gens     [nSources]*testenv.Generator
		writers  [nSources]*testenv.Writer
		written  [nSources][]testenv.Event
		entries  strings.Builder
		// extra is src1's second outbox table (the tables list), with its writer.
		extra       *testenv.Fixture
		extraWriter *testenv.Writer
	)
	for i := range nSources {
		var f *testenv.Fixture
		if i == nSources-1 {
			f = testenv.NewFixtureIn(t, fixtures[0]) // a second outbox table in src0's database
		} else {
			f = testenv.NewDatabaseFixture(t)
		}
		fixtures[i] = f
		gens[i] = testenv.NewGenerator(8, types...)
		fmt.Fprintf(&entries, "  - name: src%d\n    postgres: {url: %q, table: %s, slot: %s, publication: %s}\n    routing: {topic: %q}\n",
			i, f.PostgresURL, f.Table, f.Slot, f.Publication, f.TopicPrefix+".{event_type}")
		if i == 1 {
			// src1 holds a second outbox table of its database, through its own slot and publication.
			extra = testenv.NewFixtureIn(t, f)
			if _, err := f.DB.Exec(context.Background(), "ALTER PUBLICATION "+f.Publication+" ADD TABLE "+extra.Table); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&entries, "    tables: [{table: %s, routing: {topic: %q}}]\n", extra.Table, extra.TopicPrefix+".{event_type}")
		}
	}
	f0 := fixtures[0]
	cfgFile := filepath.Join(t.TempDir(), "fleet.yaml")
	doc := `
kafka:
  brokers: ["` + strings.Join(f0.Brokers, `", "`) + `"]
  delivery: ` + testenv.Delivery() + `
  checkpoint_topic: ` + f0.TopicPrefix + `.checkpoints
  record_timestamp: produce
postgres: {status_interval: 2s, standby_poll_interval: 500ms}
log: {format: json}
fleet: {group: "` + f0.TopicPrefix + `"}
shutdown_timeout: 20s
sources:
` + entries.String()
	if err := os.WriteFile(cfgFile, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *fleetInstance {
		addr := freeAddr(t)
		env := append(os.Environ(), "OUTBOX_CDC_CONFIG="+cfgFile, "OUTBOX_CDC_METRICS_ADDR="+addr)
		return &fleetInstance{r: startRouter(t, env), addr: addr}
	}
	// settled waits until every source is active on exactly one live instance, spread evenly (the
	// counts differ by at most one), and returns how long that took.
	settled := func(what string, live []*fleetInstance, timeout time.Duration) time.Duration {
		t.Helper()
		began := time.Now()
		var last string
		testenv.WaitFor(t, timeout, what, func() bool {
			seen := map[string]int{}
			var counts []int
			for _, in := range live {
				a := in.active(t)
				counts = append(counts, len(a))
				for _, s := range a {
					seen[s]++
				}
			}
			last = fmt.Sprintf("active per instance %v", counts)
			if len(seen) != nSources {
				return false
			}
			for _, n := range seen {
				if n != 1 {
					return false
				}
			}
			return slices.Max(counts)-slices.Min(counts) <= 1
		})
		took := time.Since(began)
		t.Logf("%s after %s: %s", what, took.Round(100*time.Millisecond), last)
		return took
	}
	startWriter := func(i int) {
		writers[i] = testenv.StartWriter(t, fixtures[i], gens[i], 2, 50*time.Millisecond, i%2 == 0)
	}
	stopWriter := func(i int) {
		t.Helper()
		evs, err := writers[i].Stop()
		if err != nil {
			t.Fatalf("writer of src%d: %v", i, err)
		}
		written[i] = append(written[i], evs...)
	}

	a, b, c := start(), start(), start()
	settled("three instances started together: every source active once, spread evenly", []*fleetInstance{a, b, c}, 60*time.Second)
	if s := sourceIn(apiView(t, a.addr), "src1"); len(s.Tables) != 1 || s.Tables[0] != extra.Table {
		t.Errorf("/api/sources shows src1's further tables as %v, want [%s]", s.Tables, extra.Table)
	}
	for i := range nSources {
		startWriter(i)
	}
	extraWriter = testenv.StartWriter(t, extra, testenv.NewGenerator(8, types...), 3, 50*time.Millisecond, false)
	time.Sleep(2 * time.Second)

	// SIGKILL the instance with the most sources: they stream again on the other two.
	all := []*fleetInstance{a, b, c}
	vi := 0
	for i, in := range all {
		if len(in.active(t)) > len(all[vi].active(t)) {
			vi = i
		}
	}
	victim := all[vi]
	rest := slices.Delete(slices.Clone(all), vi, vi+1)
	moved := victim.active(t)
	if err := victim.r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := settled(fmt.Sprintf("the sources %v of a SIGKILLed instance streaming again", moved), rest, 60*time.Second)
	if took > 30*time.Second {
		t.Errorf("the sources of a killed instance took %s to stream again (goal 15 s, session timeout 6 s)", took.Round(time.Second))
	}

	// A new instance joins and takes its share.
	d := start()
	live := append(rest, d)
	settled("a new instance joined: spread evenly again", live, 60*time.Second)
	if len(d.active(t)) == 0 {
		t.Error("the instance that joined streams nothing")
	}

	// SIGTERM: the instance hands its sources over and exits 0.
	leaving := live[0]
	if err := leaving.r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := leaving.r.exitCode(t, 60*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	live = live[1:]
	settled("the sources of an instance stopped with SIGTERM streaming again", live, 30*time.Second)

	// One source's database down: the other seven stream on and stay ready where they run.
	const down = 3
	stopWriter(down)
	unblock := fixtures[down].BlockDatabase(t)
	for round := range 3 {
		time.Sleep(2 * time.Second)
		streaming := map[string]bool{}
		for _, in := range live {
			for _, s := range in.active(t) {
				streaming[s] = true
				if code, body := httpGet(t, in.addr, "/readyz?source="+s); code != 200 {
					t.Errorf("round %d: %s not ready while only src%d's database is down: %d %s", round, s, down, code, body)
				}
			}
		}
		for i := range nSources {
			if name := fmt.Sprintf("src%d", i); i != down && !streaming[name] {
				t.Errorf("round %d: %s does not stream while only src%d's database is down", round, name, down)
			}
		}
	}
	unblock()
	startWriter(down)
	settled("every source streaming again once the database is back", live, 90*time.Second)
	time.Sleep(2 * time.Second)

	for i := range nSources {
		stopWriter(i)
		f := fixtures[i]
		got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(written[i]), 2*time.Minute, testenv.ConsumerOpts()...)
		dups := testenv.VerifyDelivery(t, f, written[i], got)
		t.Logf("src%d: %d events, %d duplicates", i, len(written[i]), dups)
	}
	extraWritten, err := extraWriter.Stop()
	if err != nil {
		t.Fatalf("writer of src1's second table: %v", err)
	}
	got := testenv.ConsumeDistinct(t, extra.Brokers, testenv.TopicsOf(extra, types...), len(extraWritten), 2*time.Minute, testenv.ConsumerOpts()...)
	dups := testenv.VerifyDelivery(t, extra, extraWritten, got)
	t.Logf("src1's second table %s: %d events, %d duplicates", extra.Table, len(extraWritten), dups)
}
