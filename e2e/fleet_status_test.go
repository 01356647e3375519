package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outbox-cdc/outbox-cdc/fleet"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// browser starts headless Chromium (the Debian package, installed by scripts/install-deps.sh) and
// returns a chromedp context for it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the status page is tested in headless Chromium, which is not installed: run scripts/install-deps.sh (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1500, 520))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

// apiView reads an instance's GET /api/sources.
func apiView(t *testing.T, addr string) fleet.View {
	t.Helper()
	code, body := httpGet(t, addr, "/api/sources")
	var v fleet.View
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("GET /api/sources = %d %s", code, body)
	}
	return v
}

func sourceIn(v fleet.View, name string) fleet.SourceView {
	for _, s := range v.Sources {
		if s.Name == name {
			return s
		}
	}
	return fleet.SourceView{}
}

// TestFleetStatusPage: two instances share two sources. The JSON API of either shows both sources
// with their owners; in headless Chromium the status page of one instance pauses the source the
// other streams: that instance stops it and releases its slot (its readiness stays true, its role is
// paused); killed, it hands the source over still paused; Resume in the page starts it again and
// every event — written before, during and after the pause — arrives, in order. A POST from another
// site is refused. A third source, gamma, is held (its outbox table is not in its publication, which
// the router may not change): the page shows it held with its reason and its retry, beside the
// paused one (the screenshot).
func TestFleetStatusPage(t *testing.T) {
	fa, fb, fc := testenv.NewFixture(t), testenv.NewFixture(t), testenv.NewFixture(t)
	if _, err := fc.DB.Exec(context.Background(), "ALTER PUBLICATION "+fc.Publication+" DROP TABLE "+fc.Table); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(t.TempDir(), "fleet.yaml")
	var entries strings.Builder
	for name, f := range map[string]*testenv.Fixture{"alpha": fa, "beta": fb, "gamma": fc} {
		fmt.Fprintf(&entries, "  - name: %s\n    postgres: {url: %q, table: %s, slot: %s, publication: %s, create_publication: %t}\n    routing: {topic: %q}\n",
			name, f.PostgresURL, f.Table, f.Slot, f.Publication, name != "gamma", f.TopicPrefix+".{event_type}")
	}
	doc := `
kafka:
  brokers: ["` + strings.Join(fa.Brokers, `", "`) + `"]
  delivery: ` + testenv.Delivery() + `
  checkpoint_topic: ` + fa.TopicPrefix + `.checkpoints
  record_timestamp: produce
postgres: {status_interval: 2s, standby_poll_interval: 500ms}
log: {format: json}
fleet: {group: "` + fa.TopicPrefix + `"}
sources:
` + entries.String()
	if err := os.WriteFile(cfgFile, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(name string) *fleetInstance {
		addr := freeAddr(t)
		env := append(os.Environ(), "OUTBOX_CDC_CONFIG="+cfgFile, "OUTBOX_CDC_METRICS_ADDR="+addr, "OUTBOX_CDC_FLEET_INSTANCE="+name)
		return &fleetInstance{r: startRouter(t, env), addr: addr}
	}
	x, y := start("instance-x"), start("instance-y")
	testenv.WaitFor(t, 60*time.Second, "alpha and beta streaming, gamma held", func() bool {
		if len(x.active(t))+len(y.active(t)) != 2 {
			return false
		}
		for _, in := range []*fleetInstance{x, y} {
			if g := sourceIn(apiView(t, in.addr), "gamma"); g.Assigned {
				return g.State == "failed" && strings.Contains(g.Reason, "ADD TABLE")
			}
		}
		return false
	})
	// y is the instance that streams the target, x the other one, whose page pauses it.
	xName, yName := "instance-x", "instance-y"
	if len(y.active(t)) == 0 {
		x, y, xName, yName = y, x, yName, xName
	}
	target := y.active(t)[0] // paused from x's page, though y streams it
	fixture := map[string]*testenv.Fixture{"alpha": fa, "beta": fb}[target]
	gen := testenv.NewGenerator(6, "Booked")
	written := testenv.Preload(t, fixture, gen, 100)

	v := apiView(t, x.addr)
	if s := sourceIn(v, target); s.Owner != yName || s.Assigned || s.State != "elsewhere" {
		t.Errorf("x's view of %s: %+v, want owned by instance-y, elsewhere", target, s)
	}
	if v.Instance != xName || len(v.Sources) != 3 {
		t.Errorf("x's view: instance %q, %d sources", v.Instance, len(v.Sources))
	}

	ctx := browser(t)
	page := "http://" + x.addr + "/status"
	row := fmt.Sprintf(`tr[data-source=%q]`, target)
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("open %s in Chromium: %v", page, err)
	}
	state, err := chromedp.Run(ctx, chromedp.AttributeValue(row, "data-state"))
	if err != nil || state.Value != "elsewhere" {
		t.Errorf("the page shows %s as %q (%v), want elsewhere", target, state.Value, err)
	}
	if err := chromedp.Do(ctx, chromedp.Click(row+` button[name="pause"]`), chromedp.WaitVisible(row+` button[name="resume"]`)); err != nil {
		t.Fatalf("click Pause in Chromium: %v", err)
	}
	slotActive := func() bool {
		var active bool
		if err := fixture.DB.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, fixture.Slot).Scan(&active); err != nil {
			t.Fatal(err)
		}
		return active
	}
	testenv.WaitFor(t, 30*time.Second, "y stopping the paused source, its slot released", func() bool {
		return !slotActive() && sourceIn(apiView(t, y.addr), target).State == "paused"
	})
	if code, body := httpGet(t, y.addr, "/readyz?source="+target); code != 200 || !strings.Contains(body, "paused") {
		t.Errorf("y's /readyz with a paused source = %d %q, want 200 saying paused", code, body)
	}
	if _, m := httpGet(t, y.addr, "/metrics"); !strings.Contains(m, fmt.Sprintf(`outbox_cdc_role{role="paused",source=%q} 1`, target)) {
		t.Errorf("y's metrics do not show %s paused", target)
	}
	written = append(written, testenv.Preload(t, fixture, gen, 100)...) // while paused

	// y dies: the source moves to x, still paused. (x may have streamed it before, in the first
	// assignment before y joined: only what x logs from here on counts.)
	mark := x.logLines()
	if err := y.r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "x owning the paused source", func() bool {
		s := sourceIn(apiView(t, x.addr), target)
		return s.Assigned && s.State == "paused"
	})
	time.Sleep(3 * time.Second)
	if slotActive() || x.streamed(target, mark) {
		t.Error("the paused source was started by the instance it moved to")
	}
	if dir := os.Getenv("OUTBOX_CDC_SCREENSHOT_DIR"); dir != "" {
		if err := chromedp.Do(ctx, chromedp.Navigate(page), chromedp.WaitVisible(row)); err == nil {
			if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "fleet-status.png"), png, 0o644)
			}
		}
	}

	// Another site's page cannot pause or resume.
	req, _ := http.NewRequest(http.MethodPost, "http://"+x.addr+"/api/sources/"+target+"/resume", nil)
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cross-site POST: %v %v, want 403", resp, err)
	} else {
		resp.Body.Close()
	}

	// Resume in the page: x streams it; every event arrives.
	if err := chromedp.Do(ctx, chromedp.Navigate(page), chromedp.Click(row+` button[name="resume"]`), chromedp.WaitVisible(row+` button[name="pause"]`)); err != nil {
		t.Fatalf("click Resume in Chromium: %v", err)
	}
	written = append(written, testenv.Preload(t, fixture, gen, 100)...)
	got := testenv.ConsumeDistinct(t, fixture.Brokers, testenv.TopicsOf(fixture, "Booked"), len(written), time.Minute, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, fixture, written, got)
	if !slotActive() {
		t.Error("the resumed source's slot is not active")
	}
}

// logLines returns how many log lines the instance wrote so far.
func (in *fleetInstance) logLines() int {
	in.r.mu.Lock()
	defer in.r.mu.Unlock()
	return len(in.r.lines)
}

// streamed reports whether the instance logged streaming source from its log line from on.
func (in *fleetInstance) streamed(source string, from int) bool {
	in.r.mu.Lock()
	defer in.r.mu.Unlock()
	for _, l := range in.r.lines[from:] {
		if l["msg"] == "streaming" && l["source"] == source {
			return true
		}
	}
	return false
}
