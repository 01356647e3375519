package e2e

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestFleetOneProcess: a configuration with a sources list runs every source in one process. A
// source that fails for good (its database does not exist) is held with its error, named on /readyz
// and in the log, while the other streams and stays ready; metrics carry the source label; status
// reports each source; SIGTERM stops the process with exit 0. No password shows anywhere.
func TestFleetOneProcess(t *testing.T) {
	f := testenv.NewFixture(t)
	broken, err := url.Parse(f.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	broken.Path = "/no_such_database_for_outbox_cdc"
	password, _ := broken.User.Password()
	addr := freeAddr(t)
	cfgFile := filepath.Join(t.TempDir(), "fleet.yaml")
	doc := `
kafka:
  brokers: ["` + strings.Join(f.Brokers, `", "`) + `"]
  delivery: ` + testenv.Delivery() + `
  checkpoint_topic: ` + f.TopicPrefix + `.checkpoints
  record_timestamp: produce
postgres:
  status_interval: 2s
log: {format: json}
fleet: {group: "` + f.TopicPrefix + `"}
metrics: {addr: "` + addr + `"}
sources:
  - name: good
    postgres: {url: "` + f.PostgresURL + `", table: ` + f.Table + `, slot: ` + f.Slot + `, publication: ` + f.Publication + `}
    routing: {topic: "` + f.TopicPrefix + `.{event_type}"}
  - name: broken
    postgres: {url: "` + broken.String() + `", slot: broken_slot}
`
	if err := os.WriteFile(cfgFile, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "OUTBOX_CDC_CONFIG="+cfgFile)
	r := startRouter(t, env)
	testenv.WaitFor(t, 60*time.Second, "source good ready", func() bool {
		code, _ := httpGet(t, addr, "/readyz?source=good")
		return code == 200
	})
	testenv.WaitFor(t, 30*time.Second, "source broken held with its error", func() bool {
		code, body := httpGet(t, addr, "/readyz?source=broken")
		return code == 503 && strings.Contains(body, "broken: failed:") && strings.Contains(body, "no_such_database")
	})
	gen := testenv.NewGenerator(10, "StockReserved")
	want := testenv.Preload(t, f, gen, 300)
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "StockReserved"), len(want), time.Minute, testenv.ConsumerOpts()...)
	testenv.VerifyDelivery(t, f, want, got)

	if code, body := httpGet(t, addr, "/readyz"); code != 503 || !strings.Contains(body, "good: streaming") || !strings.Contains(body, "broken: failed") {
		t.Errorf("/readyz = %d %q: want 503 naming each source's state", code, body)
	}
	_, metrics := httpGet(t, addr, "/metrics")
	for _, want := range []string{`outbox_cdc_role{role="active",source="good"} 1`, `outbox_cdc_role{role="active",source="broken"} 0`,
		`outbox_cdc_events_produced_total{event_type="StockReserved",source="good"`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	r.waitLog(t, "source stopped", 10*time.Second)

	// status reports each source; the broken one makes it unhealthy (exit 1).
	out, err := exec.Command(binary, "status", "--json", "--config", cfgFile).Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("status with a broken source: %v, want exit 1", err)
	}
	var st struct {
		Healthy bool
		Sources []struct {
			Name    string
			Healthy bool
		}
	}
	if err := json.Unmarshal(out, &st); err != nil || len(st.Sources) != 2 || st.Sources[0].Name != "good" || st.Sources[1].Name != "broken" || st.Healthy {
		t.Errorf("status --json = %s (%v): want both sources, unhealthy", out, err)
	}
	if out, err := exec.Command(binary, "status", "--json", "--config", cfgFile, "--source", "good").Output(); err != nil || !strings.Contains(string(out), `"name": "good"`) {
		t.Errorf("status --source good: %v %s", err, out)
	}

	_, ready := httpGet(t, addr, "/readyz")
	for what, text := range map[string]string{"log": r.log(), "/readyz": ready, "status": string(out)} {
		if password != "" && strings.Contains(text, password) {
			t.Errorf("the password shows in %s", what)
		}
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := r.exitCode(t, 60*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
}
