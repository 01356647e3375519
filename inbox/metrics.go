package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are an Inbox's Prometheus metrics, labelled with its consumer name.
type metrics struct {
	reg           prometheus.Registerer
	events        *prometheus.CounterVec
	failures      prometheus.Counter
	pruned        prometheus.Counter
	handleSeconds prometheus.Histogram
}

// newMetrics creates the metrics and registers them with reg, when reg is not nil.
func newMetrics(consumer string, reg prometheus.Registerer) (*metrics, error) {
	labels := prometheus.Labels{"consumer": consumer}
	m := &metrics{
		reg: reg,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_inbox_events_total", ConstLabels: labels,
			Help: "Events handled by outcome: applied, duplicate (already claimed), stale (version not above the last applied), dead_lettered."}, []string{"outcome"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_inbox_handler_failures_total", ConstLabels: labels,
			Help: "Handler attempts that failed (each retry counts)."}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_inbox_pruned_total", ConstLabels: labels,
			Help: "Claims deleted by retention."}),
		handleSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_inbox_handle_seconds", ConstLabels: labels,
			Help: "Time to apply an event: claim, version check, handler and commit.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	for _, o := range []string{OutcomeApplied, OutcomeDuplicate, OutcomeStale, OutcomeDeadLettered} {
		m.events.WithLabelValues(o) // every outcome exported from the start, at 0
	}
	if reg == nil {
		return m, nil
	}
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("inbox: register metrics (one Inbox per consumer name and registry): %w", err)
		}
		done = append(done, c)
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.events, m.failures, m.pruned, m.handleSeconds}
}

// unregister removes the metrics from the registry they were registered with.
func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, c := range m.collectors() {
		m.reg.Unregister(c)
	}
}
