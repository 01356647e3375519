package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"gopkg.in/yaml.v3"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

func fixedHealth(state pipeline.State) func() pipeline.Health {
	return func() pipeline.Health {
		s := pipeline.Health{
			State: state, Rows: 10, Transactions: 4, IgnoredDeletes: 3, Produced: 9, ProducedBytes: 900,
			InFlightRecords: 1, InFlightBytes: 100, ConfirmedLSN: 5000, ServerWALEnd: 6000, SecondsBehind: 1.5,
			Restarts: 2, Errors: map[string]int64{"kafka": 2}, LastServerMessage: time.Now(),
			Slot:      replication.SlotState{Name: "s", Exists: true, Active: true, ActivePID: 42, WALStatus: "reserved", LagBytes: 1000},
			SlotKnown: true, SlotObservedAt: time.Now(),
			SlotMonitorErrors: 1, SlotMonitorLastSuccess: time.Now(),
			CheckpointLSN: 4800, TransactionsCommitted: 7, TransactionsAborted: 1, SkippedRows: 12,
			PhantomRisk: true, PhantomRiskKnown: true, Warnings: []string{"phantom risk"},
		}
		switch state {
		case pipeline.StateStreaming:
			s.Ready, s.NotReady = true, "streaming"
		case pipeline.StateStandby:
			s.NotReady, s.StandbyReady = "standby: another instance holds the slot", true
		default:
			s.NotReady = "starting: not streaming"
		}
		return s
	}
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

func TestHealthEndpoints(t *testing.T) {
	tests := []struct {
		state    pipeline.State
		code     int
		contains string
	}{
		{pipeline.StateStreaming, 200, "streaming"},
		{pipeline.StateStandby, 503, "standby"},
		{pipeline.StateStarting, 503, "not streaming"},
	}
	for _, tt := range tests {
		m := New()
		m.Watch(config.DefaultSourceName, fixedHealth(tt.state))
		h := m.Handler()
		if code, body := get(t, h, "/readyz"); code != tt.code || !strings.Contains(body, tt.contains) {
			t.Errorf("%s: /readyz = %d %q, want %d containing %q", tt.state, code, body, tt.code, tt.contains)
		}
		if _, body := get(t, h, "/readyz"); !strings.Contains(body, "warning: phantom risk") {
			t.Errorf("%s: /readyz = %q does not carry the warnings", tt.state, body)
		}
		if code, _ := get(t, h, "/healthz"); code != 200 {
			t.Errorf("%s: /healthz = %d", tt.state, code)
		}
		// A two-replica deployment's probe counts a healthy standby as ready, nothing else.
		want := tt.code
		if tt.state == pipeline.StateStandby {
			want = 200
		}
		if code, body := get(t, h, "/readyz?standby=ready"); code != want || !strings.Contains(body, tt.contains) {
			t.Errorf("%s: /readyz?standby=ready = %d %q, want %d", tt.state, code, body, want)
		}
	}
}

func TestMetricsExposition(t *testing.T) {
	m := New()
	snap := fixedHealth(pipeline.StateStreaming)
	m.Watch("s1", snap)
	o := m.Source("s1")
	o.Produced("orders", "OrderPaid", 100, 3*time.Millisecond, 40*time.Millisecond)
	o.DeadLettered("OrderPaid", "too_large")
	o.TransactionCommitted(router.TxnCommit{Records: 250, Flush: 3 * time.Millisecond, End: time.Millisecond, Settle: 2 * time.Millisecond})
	_, body := get(t, m.Handler(), "/metrics")
	for _, want := range []string{
		`outbox_cdc_events_produced_total{event_type="OrderPaid",source="s1",topic="orders"} 1`,
		`outbox_cdc_events_dead_lettered_total{event_type="OrderPaid",reason="too_large",source="s1"} 1`,
		`outbox_cdc_events_decoded_total{source="s1"} 10`,
		`outbox_cdc_ignored_operations_total{operation="delete",source="s1"} 3`,
		`outbox_cdc_slot_lag_bytes{source="s1"} 1000`,
		`outbox_cdc_failover_phantom_risk{source="s1"} 1`,
		`outbox_cdc_build_info{commit=`,
		`outbox_cdc_seconds_behind{source="s1"} 1.5`,
		`outbox_cdc_role{role="active",source="s1"} 1`,
		`outbox_cdc_role{role="standby",source="s1"} 0`,
		`outbox_cdc_slot_wal_status{source="s1",status="reserved"} 1`,
		`outbox_cdc_errors_total{class="kafka",source="s1"} 2`,
		`outbox_cdc_reconnects_total{source="s1"} 2`,
		`outbox_cdc_end_to_end_latency_seconds_count{source="s1"} 1`,
		`outbox_cdc_produce_latency_seconds_count{source="s1"} 1`,
		`outbox_cdc_inflight_records{source="s1"} 1`,
		`outbox_cdc_slot_monitor_errors_total{source="s1"} 1`,
		`outbox_cdc_slot_monitor_last_success_timestamp_seconds{source="s1"}`,
		`outbox_cdc_server_silence_seconds{source="s1"}`,
		`outbox_cdc_slot_active{source="s1"} 1`,
		`outbox_cdc_kafka_transactions_total{result="committed",source="s1"} 7`,
		`outbox_cdc_kafka_transactions_total{result="aborted",source="s1"} 1`,
		`outbox_cdc_checkpoint_lsn{source="s1"} 4800`,
		`outbox_cdc_events_skipped_total{source="s1"} 12`,
		`outbox_cdc_kafka_transaction_records_count{source="s1"} 1`,
		`outbox_cdc_kafka_transaction_commit_seconds_sum{source="s1"} 0.004`,
		`outbox_cdc_kafka_transaction_phase_seconds_sum{phase="settle",source="s1"} 0.002`,
		`outbox_cdc_kafka_transaction_phase_seconds_sum{phase="flush",source="s1"} 0.003`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestUnknownIsNotShownAsHealthy: a streaming pipeline that is not ready (silent server, slot state
// unknown) is not active, its /readyz says why, and the slot figures that are not known now are left
// out rather than shown at their last value.
func TestUnknownIsNotShownAsHealthy(t *testing.T) {
	snap := func() pipeline.Health {
		return pipeline.Health{State: pipeline.StateStreaming, NotReady: "silent: nothing received from PostgreSQL for over 30s",
			LastServerMessage: time.Now().Add(-time.Minute), Errors: map[string]int64{}, SlotMonitorErrors: 3}
	}
	m := New()
	m.Watch("s1", snap)
	h := m.Handler()
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "silent") {
		t.Fatalf("/readyz = %d %q, want 503 saying silent", code, body)
	}
	_, body := get(t, h, "/metrics")
	for _, want := range []string{`outbox_cdc_role{role="active",source="s1"} 0`, `outbox_cdc_slot_wal_status{source="s1",status="unknown"} 1`, `outbox_cdc_slot_monitor_errors_total{source="s1"} 3`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, absent := range []string{"outbox_cdc_slot_lag_bytes{", "outbox_cdc_slot_monitor_last_success_timestamp_seconds{"} {
		if strings.Contains(body, absent) {
			t.Errorf("/metrics shows %s though nothing is known", absent)
		}
	}
}

func TestLabelCardinalityIsBounded(t *testing.T) {
	m := New()
	o := m.Source("s1")
	for i := 0; i < 1000; i++ {
		o.Produced("topic", "Type"+strings.Repeat("x", i%500)+string(rune('a'+i%26)), 1, time.Millisecond, 0)
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "outbox_cdc_events_produced_total" {
			if n := len(f.GetMetric()); n > maxLabelSets+1 {
				t.Fatalf("%d label sets, want at most %d", n, maxLabelSets+1)
			}
			return
		}
	}
	t.Fatal("outbox_cdc_events_produced_total missing")
}

// TestDashboardsUseExistingMetrics: every outbox_cdc_* name in the Grafana dashboard and the alert
// rules is a metric this package exposes.
func TestDashboardsUseExistingMetrics(t *testing.T) {
	m := New()
	m.Watch("s1", fixedHealth(pipeline.StateStreaming))
	m.Watch("s2", func() pipeline.Health { // paused: the metrics only a paused source has
		h := fixedHealth(pipeline.StateStopped)()
		h.Paused, h.PausedSince = true, time.Now()
		return h
	})
	m.Source("s1").Produced("t", "e", 1, time.Millisecond, time.Millisecond)
	m.Source("s1").DeadLettered("e", "unroutable")
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		exposed[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exposed[name+suffix] = true
			}
		}
	}
	nameRE := regexp.MustCompile(`outbox_cdc_[a-z0-9_]+`)
	for _, file := range []string{"../deploy/grafana/outbox-cdc-dashboard.json", "../deploy/prometheus/outbox-cdc-alerts.yml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(file, ".yml") {
			var rules struct {
				Groups []struct {
					Rules []struct{ Alert, Expr string }
				}
			}
			if err := yaml.Unmarshal(data, &rules); err != nil || len(rules.Groups) == 0 {
				t.Fatalf("%s: not valid alert rules: %v", file, err)
			}
			alerts := map[string]bool{}
			for _, g := range rules.Groups {
				for _, r := range g.Rules {
					alerts[r.Alert] = true
				}
			}
			for _, want := range []string{"OutboxCdcSlotLost", "OutboxCdcNotStreaming", "OutboxCdcNotStreamingSlotInactive", "OutboxCdcSlotMonitorFailing", "OutboxCdcServerSilent", "OutboxCdcFailoverPhantomRisk", "OutboxCdcAbsent"} {
				if !alerts[want] {
					t.Errorf("%s lacks the alert %s", file, want)
				}
			}
		}
		names := nameRE.FindAllString(string(data), -1)
		if len(names) == 0 {
			t.Fatalf("%s references no metric", file)
		}
		for _, n := range names {
			if !exposed[n] {
				t.Errorf("%s references %s, which outbox-cdc does not expose", file, n)
			}
		}
	}
}

// TestInvalidUTF8LabelsNeverPanic: an event_type that is not valid UTF-8 (a SQL_ASCII database, a
// bytea column) reaches the counters as it is; it must be counted, never panic the process.
func TestInvalidUTF8LabelsNeverPanic(t *testing.T) {
	m := New()
	bad := "Order\xff\xfePaid"
	o := m.Source("s1")
	o.Produced("orders", bad, 10, time.Millisecond, time.Millisecond)
	o.DeadLettered(bad, "unroutable")
	o.DeadLettered("\xc3", "rejected")
	m.Watch("s1", fixedHealth(pipeline.StateStreaming))
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	if !strings.Contains(body, `event_type="Order`+"\uFFFD"+`Paid"`) {
		t.Fatalf("the invalid event type is not counted under its sanitized name:\n%s", body)
	}
}

// TestDashboardIsScopedToADeployment: the dashboard has namespace, job and instance variables, and
// every query of an outbox-cdc metric is scoped by them (one release's figures never mix with
// another's); the exactly-once metrics have panels.
func TestDashboardIsScopedToADeployment(t *testing.T) {
	data, err := os.ReadFile("../deploy/grafana/outbox-cdc-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct{ List []struct{ Name string } }
		Panels     []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, want := range []string{"namespace", "job", "instance", "source"} {
		if !vars[want] {
			t.Errorf("the dashboard has no $%s variable", want)
		}
	}
	metricRE := regexp.MustCompile(`outbox_cdc_[a-z_]+(\{[^}]*\})?`)
	seen := map[string]bool{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricRE.FindAllStringSubmatch(tg.Expr, -1) {
				seen[strings.SplitN(m[0], "{", 2)[0]] = true
				if !strings.Contains(m[1], `namespace=~"$namespace"`) || !strings.Contains(m[1], `job=~"$job"`) || !strings.Contains(m[1], `instance=~"$instance"`) || !strings.Contains(m[1], `source=~"$source"`) {
					t.Errorf("panel %q: %s is not scoped by the variables", p.Title, m[0])
				}
			}
		}
	}
	for _, want := range []string{"outbox_cdc_kafka_transactions_total", "outbox_cdc_kafka_transaction_commit_seconds_bucket", "outbox_cdc_checkpoint_lsn"} {
		if !seen[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// TestSources: every source's metrics carry its label, one source's failure leaves the others'
// readiness alone, /readyz?source= scopes to one, and an unwatched source's series disappear.
func TestSources(t *testing.T) {
	m := New()
	m.Watch("orders", fixedHealth(pipeline.StateStreaming))
	m.Watch("billing", fixedHealth(pipeline.StateStarting))
	m.Source("orders").Produced("orders", "OrderPaid", 1, time.Millisecond, time.Millisecond)
	h := m.Handler()
	_, body := get(t, h, "/metrics")
	for _, want := range []string{
		`outbox_cdc_role{role="active",source="orders"} 1`,
		`outbox_cdc_role{role="active",source="billing"} 0`,
		`outbox_cdc_role{role="starting",source="billing"} 1`,
		`outbox_cdc_events_produced_total{event_type="OrderPaid",source="orders",topic="orders"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "orders: streaming") || !strings.Contains(body, "billing: starting") {
		t.Errorf("/readyz = %d %q: want 503 naming each source's state", code, body)
	}
	if code, _ := get(t, h, "/readyz?source=orders"); code != 200 {
		t.Errorf("/readyz?source=orders = %d, want 200 while billing fails", code)
	}
	if code, _ := get(t, h, "/readyz?source=billing"); code != 503 {
		t.Errorf("/readyz?source=billing = %d, want 503", code)
	}
	if code, _ := get(t, h, "/readyz?source=nope"); code != 404 {
		t.Errorf("/readyz?source=nope = %d, want 404", code)
	}
	m.Unwatch("billing")
	if _, body := get(t, h, "/metrics"); strings.Contains(body, `source="billing"`) && strings.Contains(body, "outbox_cdc_role{") && strings.Contains(body, `role="starting",source="billing"`) {
		t.Error("an unwatched source's health series remain")
	}
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Errorf("/readyz after unwatching the failing source = %d, want 200", code)
	}
}

// TestProducedCountsEveryRecordOnce: acknowledged records are counted by (topic, event type) through
// the observer's counter cache: each record once, under its own labels, and past maxLabelSets under
// _other, however many distinct event types arrive.
func TestProducedCountsEveryRecordOnce(t *testing.T) {
	m := New()
	o := m.Source("s1")
	want := map[[2]string]float64{}
	for i := range 3 * maxLabelSets {
		topic, et := "orders", fmt.Sprintf("T%d", i%(2*maxLabelSets))
		if i%3 == 0 {
			topic = "payments"
		}
		o.Produced(topic, et, 1, time.Millisecond, 0)
		tt, ee := m.bounded("s1", topic, et) // the labels the record must be counted under
		want[[2]string{tt, ee}]++
	}
	var total float64
	for labels, n := range want {
		if got := testutil.ToFloat64(m.produced.WithLabelValues("s1", labels[0], labels[1])); got != n {
			t.Errorf("topic %q, event type %q: counted %v, want %v", labels[0], labels[1], got, n)
		}
		total += n
	}
	if total != 3*maxLabelSets {
		t.Fatalf("the test counted %v records, want %d", total, 3*maxLabelSets)
	}
	if _, ok := want[[2]string{"_other", "_other"}]; !ok {
		t.Fatal("no record went past maxLabelSets: the test does not reach the bound")
	}
}
