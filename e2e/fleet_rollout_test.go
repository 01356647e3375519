package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// post sends a POST to the instance at addr, with a bearer token when token is not empty.
func post(t *testing.T, addr, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = fmt.Fprint(&b, resp.Status)
	return resp.StatusCode, b.String()
}

// TestFleetRollingUpdateAddsASource: two instances share s0, s1 and s2, with s2 paused through the
// API; a rolling update brings two instances whose list adds s3, with writers on every source
// throughout. While old and new instances run side by side no source is ever active on two instances
// at once, s3 streams on a new instance, and s2 stays paused; when the old instances leave, the new
// ones share s0, s1 and s3 evenly (2/1). Resumed, s2 delivers what was written while it was paused.
// Every event of every source arrives, in order. Pause and resume need the admin token: without it
// they are refused.
func TestFleetRollingUpdateAddsASource(t *testing.T) {
	const n = 4
	types := []string{"Placed", "Paid"}
	var fixtures [n]*testenv.Fixture
	var entries [n]string
	for i := range n {
		f := testenv.NewFixture(t)
		fixtures[i] = f
		entries[i] = fmt.Sprintf("  - name: s%d\n    postgres: {url: %q, table: %s, slot: %s, publication: %s}\n    routing: {topic: %q}\n",
			i, f.PostgresURL, f.Table, f.Slot, f.Publication, f.TopicPrefix+".{event_type}")
	}
	f0 := fixtures[0]
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte("oncall:rollout-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	head := `
kafka:
  brokers: ["` + strings.Join(f0.Brokers, `", "`) + `"]
  delivery: ` + testenv.Delivery() + `
  checkpoint_topic: ` + f0.TopicPrefix + `.checkpoints
  record_timestamp: produce
postgres: {status_interval: 2s, standby_poll_interval: 500ms}
log: {format: json}
metrics: {admin_token_file: "` + tokenFile + `"}
fleet: {group: "` + f0.TopicPrefix + `"}
shutdown_timeout: 20s
sources:
`
	write := func(name string, list ...int) string {
		var b strings.Builder
		b.WriteString(head)
		for _, i := range list {
			b.WriteString(entries[i])
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	oldCfg, newCfg := write("old.yaml", 0, 1, 2), write("new.yaml", 0, 1, 2, 3)
	start := func(cfg, name string) *fleetInstance {
		addr := freeAddr(t)
		env := append(os.Environ(), "OUTBOX_CDC_CONFIG="+cfg, "OUTBOX_CDC_METRICS_ADDR="+addr, "OUTBOX_CDC_FLEET_INSTANCE="+name)
		return &fleetInstance{r: startRouter(t, env), addr: addr}
	}
	// active counts, per source, the instances that report it active now.
	active := func(ins ...*fleetInstance) map[string][]string {
		out := map[string][]string{}
		for _, in := range ins {
			for _, s := range in.active(t) {
				out[s] = append(out[s], in.addr)
			}
		}
		return out
	}

	old1, old2 := start(oldCfg, "old-1"), start(oldCfg, "old-2")
	testenv.WaitFor(t, 60*time.Second, "the old instances streaming s0, s1, s2", func() bool {
		a := active(old1, old2)
		return len(a["s0"]) == 1 && len(a["s1"]) == 1 && len(a["s2"]) == 1
	})
	// Pause s2: refused without the token (even from this host), taken with it.
	if code, body := post(t, old1.addr, "/api/sources/s2/pause", ""); code != http.StatusUnauthorized {
		t.Errorf("pause without the token: %d %s, want 401", code, body)
	}
	if code, body := post(t, old1.addr, "/api/sources/s2/pause", "rollout-test-token"); code != http.StatusAccepted {
		t.Fatalf("pause with the token: %d %s", code, body)
	}
	testenv.WaitFor(t, 30*time.Second, "s2 paused", func() bool { return len(active(old1, old2)["s2"]) == 0 })
	if s := sourceIn(apiView(t, old2.addr), "s2"); s.PausedBy != "oncall" {
		t.Errorf("s2 paused by %q, want the token's name oncall", s.PausedBy)
	}

	var writers [n]*testenv.Writer
	var written [n][]testenv.Event
	for i := range 3 {
		writers[i] = testenv.StartWriter(t, fixtures[i], testenv.NewGenerator(6, types...).WithPrefix(fmt.Sprintf("s%d-", i)), 2, 20*time.Millisecond, i == 1)
	}

	// Watch, all along, that no source is active on two instances at once.
	var mu sync.Mutex
	var doubles []string
	all := []*fleetInstance{old1, old2}
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(300 * time.Millisecond):
			}
			mu.Lock()
			ins := slices.Clone(all)
			mu.Unlock()
			for s, on := range active(ins...) {
				if len(on) > 1 {
					mu.Lock()
					doubles = append(doubles, fmt.Sprintf("%s on %v", s, on))
					mu.Unlock()
				}
			}
		}
	}()

	new1, new2 := start(newCfg, "new-1"), start(newCfg, "new-2")
	mu.Lock()
	all = append(all, new1, new2)
	mu.Unlock()
	testenv.WaitFor(t, 90*time.Second, "s3 streaming on a new instance while the old ones run", func() bool {
		a := active(old1, old2, new1, new2)
		return len(a["s3"]) == 1 && len(a["s0"]) == 1 && len(a["s1"]) == 1
	})
	if on := active(old1, old2)["s3"]; len(on) > 0 {
		t.Errorf("s3, which only the new instances list, is active on an old one: %v", on)
	}
	writers[3] = testenv.StartWriter(t, fixtures[3], testenv.NewGenerator(6, types...).WithPrefix("s3-"), 2, 20*time.Millisecond, false)
	time.Sleep(3 * time.Second)
	if on := active(old1, old2, new1, new2)["s2"]; len(on) > 0 {
		t.Errorf("s2 streams during the rolling update though it is paused: %v", on)
	}

	// The old instances leave, one after the other.
	for _, in := range []*fleetInstance{old1, old2} {
		if err := in.r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := in.r.exitCode(t, 60*time.Second); code != 0 {
			t.Errorf("an old instance exited %d after SIGTERM", code)
		}
	}
	testenv.WaitFor(t, 60*time.Second, "the new instances sharing s0, s1, s3 evenly", func() bool {
		a := active(new1, new2)
		n1, n2 := len(new1.active(t)), len(new2.active(t))
		return len(a["s0"]) == 1 && len(a["s1"]) == 1 && len(a["s3"]) == 1 && max(n1, n2) == 2 && min(n1, n2) == 1
	})
	if s := sourceIn(apiView(t, new1.addr), "s2"); !s.Paused || s.State != "paused" {
		t.Errorf("s2 after the rolling update: %+v, want still paused", s)
	}
	if code, body := post(t, new2.addr, "/api/sources/s2/resume", "rollout-test-token"); code != http.StatusAccepted {
		t.Fatalf("resume: %d %s", code, body)
	}
	testenv.WaitFor(t, 60*time.Second, "s2 streaming again", func() bool { return len(active(new1, new2)["s2"]) == 1 })
	time.Sleep(2 * time.Second)
	close(stopWatch)
	<-watched
	if len(doubles) > 0 {
		t.Errorf("sources active on two instances at once: %v", doubles)
	}
	for i := range n {
		evs, err := writers[i].Stop()
		if err != nil {
			t.Fatalf("writer of s%d: %v", i, err)
		}
		written[i] = evs
		f := fixtures[i]
		got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(written[i]), 2*time.Minute, testenv.ConsumerOpts()...)
		dups := testenv.VerifyDelivery(t, f, written[i], got)
		t.Logf("s%d: %d events, %d duplicates", i, len(written[i]), dups)
	}
}
