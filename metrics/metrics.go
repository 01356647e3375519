// Package metrics exposes outbox-cdc's Prometheus metrics and its health endpoints: /metrics,
// /healthz (the process is alive) and /readyz (streaming; a standby says so distinctly).
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/buildinfo"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/router"
)

const namespace = "outbox_cdc"

// maxLabelSets bounds the label combinations of the per-topic and per-event-type counters; further
// combinations are counted under "_other", so a runaway event_type cannot blow up the series count.
const maxLabelSets = 200

// Metrics holds the registry and the metrics that are pushed as records are acknowledged, labelled
// by source. Source returns one source's router.Observer; Watch adds a source's health.
type Metrics struct {
	reg            *prometheus.Registry
	produced       *prometheus.CounterVec
	deadLettered   *prometheus.CounterVec
	produceLatency *prometheus.HistogramVec
	endToEnd       *prometheus.HistogramVec
	txnRecords     *prometheus.HistogramVec
	txnCommit      *prometheus.HistogramVec
	txnPhase       *prometheus.HistogramVec

	mu      sync.Mutex
	labels  map[string]bool
	sources []watched
}

// watched is one source whose health the metrics and health endpoints read.
type watched struct {
	name   string
	health func() pipeline.Health
}

// New creates the metrics with their own registry (no global state), including Go runtime and
// process metrics.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_produced_total",
			Help: "Events acknowledged by Kafka on their topic, by topic and event type (at most 200 label sets, then _other).",
		}, []string{"source", "topic", "event_type"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "events_dead_lettered_total",
			Help: "Events acknowledged on the dead-letter topic, by event type and reason (unroutable, undecodable, too_large, rejected).",
		}, []string{"source", "event_type", "reason"}),
		produceLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "produce_latency_seconds",
			Help:    "Time from handing a record to the Kafka client to its acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"source"}),
		endToEnd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "end_to_end_latency_seconds",
			Help:    "Time from the transaction's commit (its Begin message's commit time) to the Kafka acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"source"}),
		txnRecords: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "kafka_transaction_records",
			Help:    "Records per committed Kafka transaction (exactly-once mode; the checkpoint record not counted).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}, []string{"source"}),
		txnCommit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "kafka_transaction_commit_seconds",
			Help:    "Time to commit a Kafka transaction (exactly-once mode): checkpoint produced, every record acknowledged, transaction ended.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"source"}),
		txnPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "kafka_transaction_phase_seconds",
			Help: "Where a Kafka transaction's commit spends its time (exactly-once mode), by phase: flush (every record acknowledged), " +
				"end (the EndTxn round trip), settle (until the coordinator has written the commit markers; the next transaction waits for it).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"source", "phase"}),
		labels: map[string]bool{},
	}
	info := buildinfo.Read()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help: "1, labelled with the build's version, commit (modified when the tree had changes), Go version and platform.",
	}, []string{"version", "commit", "go_version", "platform"})
	commit := info.Commit
	if info.Modified {
		commit += "+modified"
	}
	build.WithLabelValues(info.Version, commit, info.GoVersion, info.Platform).Set(1)
	m.reg.MustRegister(m.produced, m.deadLettered, m.produceLatency, m.endToEnd, m.txnRecords, m.txnCommit, m.txnPhase, build,
		&healthCollector{m: m}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// bounded returns the label values to use: valid UTF-8 (row content may be anything, and the
// client library panics on invalid label values), replaced by _other past maxLabelSets (over every
// source).
func (m *Metrics) bounded(source, a, b string) (string, string) {
	a, b = strings.ToValidUTF8(a, "\uFFFD"), strings.ToValidUTF8(b, "\uFFFD")
	key := source + "\x00" + a + "\x00" + b
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.labels[key] {
		return a, b
	}
	if len(m.labels) >= maxLabelSets {
		return "_other", "_other"
	}
	m.labels[key] = true
	return a, b
}

// Source returns the observer of one source's acknowledged records: a router.Observer and
// router.TxnObserver whose metrics carry source=name.
func (m *Metrics) Source(name string) *SourceObserver {
	return &SourceObserver{
		m: m, name: name,
		produceLatency: m.produceLatency.WithLabelValues(name),
		endToEnd:       m.endToEnd.WithLabelValues(name),
		txnRecords:     m.txnRecords.WithLabelValues(name),
		txnCommit:      m.txnCommit.WithLabelValues(name),
		txnFlush:       m.txnPhase.WithLabelValues(name, "flush"),
		txnEnd:         m.txnPhase.WithLabelValues(name, "end"),
		txnSettle:      m.txnPhase.WithLabelValues(name, "settle"),
	}
}

// SourceObserver counts one source's acknowledged records; create it with Metrics.Source.
type SourceObserver struct {
	m                                               *Metrics
	name                                            string
	produceLatency, endToEnd, txnRecords, txnCommit prometheus.Observer
	txnFlush, txnEnd, txnSettle                     prometheus.Observer

	// counters caches the events_produced_total counter of each (topic, event type) seen, so that an
	// acknowledged record costs a map lookup, not a label key built and two locked lookups. Bounded
	// by maxLabelSets: past it, the slow path (which counts further combinations under _other).
	mu       sync.Mutex
	counters map[producedKey]prometheus.Counter
}

// producedKey is a record's (topic, event type) as the router reports it.
type producedKey struct{ topic, eventType string }

// Produced implements router.Observer.
func (o *SourceObserver) Produced(topic, eventType string, _ int, produceLatency, endToEnd time.Duration) {
	o.producedCounter(topic, eventType).Inc()
	o.produceLatency.Observe(produceLatency.Seconds())
	if endToEnd > 0 {
		o.endToEnd.Observe(endToEnd.Seconds())
	}
}

// producedCounter is the events_produced_total counter for (topic, eventType), its labels bounded.
func (o *SourceObserver) producedCounter(topic, eventType string) prometheus.Counter {
	k := producedKey{topic, eventType}
	o.mu.Lock()
	c, ok := o.counters[k]
	o.mu.Unlock()
	if ok {
		return c
	}
	bt, be := o.m.bounded(o.name, topic, eventType)
	c = o.m.produced.WithLabelValues(o.name, bt, be)
	o.mu.Lock()
	if o.counters == nil {
		o.counters = make(map[producedKey]prometheus.Counter)
	}
	if len(o.counters) < maxLabelSets {
		o.counters[k] = c
	}
	o.mu.Unlock()
	return c
}

// DeadLettered implements router.Observer.
func (o *SourceObserver) DeadLettered(eventType, reason string) {
	eventType, reason = o.m.bounded(o.name, "dlq:"+eventType, reason)
	o.m.deadLettered.WithLabelValues(o.name, eventType[len("dlq:"):], reason).Inc()
}

// TransactionCommitted implements router.TxnObserver.
func (o *SourceObserver) TransactionCommitted(c router.TxnCommit) {
	o.txnRecords.Observe(float64(c.Records))
	o.txnCommit.Observe(c.Latency().Seconds())
	o.txnFlush.Observe(c.Flush.Seconds())
	o.txnEnd.Observe(c.End.Seconds())
	o.txnSettle.Observe(c.Settle.Seconds())
}

// Watch adds a source whose health is read at every scrape and by /readyz. A name watched again
// replaces the earlier one.
func (m *Metrics) Watch(name string, health func() pipeline.Health) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.sources {
		if m.sources[i].name == name {
			m.sources[i].health = health
			return
		}
	}
	m.sources = append(m.sources, watched{name: name, health: health})
}

// Unwatch removes a source (one this instance no longer streams): its series disappear.
func (m *Metrics) Unwatch(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sources = slices.DeleteFunc(m.sources, func(w watched) bool { return w.name == name })
}

// watchedSources returns the sources watched now, in the order they were added.
func (m *Metrics) watchedSources() []watched {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.sources)
}

// Registry returns the registry, for tests and embedding.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics, /healthz and /readyz. /readyz answers 200 when every watched source is
// ready (with ?standby=ready, a hot standby ready to take over counts too), and ?source=NAME scopes
// it to one source; its body says each source's state and warnings.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		sources := m.watchedSources()
		if name := r.URL.Query().Get("source"); name != "" {
			sources = slices.DeleteFunc(sources, func(s watched) bool { return s.name != name })
			if len(sources) == 0 {
				http.Error(w, fmt.Sprintf("no source %q on this instance", name), http.StatusNotFound)
				return
			}
		}
		// A two-replica deployment's probe counts a hot standby ready to take over as ready, or its
		// rollouts and drains would wait forever for the standby.
		standbyOK := r.URL.Query().Get("standby") == "ready"
		// An instance of a fleet that is assigned no source (more instances than sources) is ready:
		// there is nothing for it to stream.
		ready := true
		var body strings.Builder
		if len(sources) == 0 {
			body.WriteString("no source assigned to this instance\n")
		}
		for _, src := range sources {
			s := src.health()
			if !s.Ready && !(s.StandbyReady && standbyOK) && !s.Paused {
				ready = false
			}
			prefix := ""
			if len(sources) > 1 || src.name != config.DefaultSourceName {
				prefix = src.name + ": "
			}
			fmt.Fprintln(&body, prefix+s.NotReady)
			for _, warning := range s.Warnings {
				fmt.Fprintln(&body, prefix+"warning: "+warning)
			}
		}
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, body.String())
	})
	return mux
}

// Serve serves Handler on ln until ctx ends; with pprof, Go's profiles too, under /debug/pprof/;
// extra handlers (the fleet API) are served at their paths.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener, pprof bool, extra map[string]http.Handler) error {
	handler := m.Handler()
	if pprof || len(extra) > 0 {
		mux := http.NewServeMux()
		mux.Handle("/", handler)
		if pprof {
			mux.HandleFunc("/debug/pprof/", httppprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
		}
		for path, h := range extra {
			mux.Handle(path, h)
		}
		handler = mux
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// healthCollector turns one reading of each watched source's health per scrape into metrics.
type healthCollector struct {
	m *Metrics
}

// desc describes a metric read from a source's health: labelled source first, then labels.
func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, append([]string{"source"}, labels...), nil)
}

var (
	descDecoded      = desc("events_decoded_total", "Outbox inserts decoded from the WAL.")
	descTransactions = desc("transactions_total", "Committed transactions received from the slot.")
	descIgnored      = desc("ignored_operations_total", "Changes ignored: outbox updates, deletes, truncates, other tables' changes, and WAL messages of other prefixes.", "operation")
	descMessages     = desc("messages_decoded_total", "Outbox events decoded from WAL messages (postgres.message_prefixes).")
	descBytes        = desc("produced_bytes_total", "Key and value bytes acknowledged by Kafka.")
	descReconnects   = desc("reconnects_total", "Sessions rebuilt after a failure (replays from the slot).")
	descErrors       = desc("errors_total", "Failures by class: postgres, kafka, undeliverable.", "class")
	descInFlightRecs = desc("inflight_records", "Records handed to Kafka and not yet acknowledged.")
	descInFlightWin  = desc("inflight_window_records", "The in-flight window: how many records may be handed to Kafka and not yet acknowledged now (it adapts between limits.min_inflight_records and limits.max_inflight_records).")
	descInFlightB    = desc("inflight_bytes", "Bytes of records handed to Kafka and not yet acknowledged, with the memory blocks their rows were read into (as limits.max_inflight_bytes counts them).")
	descConfirmed    = desc("confirmed_lsn", "Last WAL position confirmed to PostgreSQL (as a byte position).")
	descWALEnd       = desc("server_wal_end_lsn", "Server WAL end from the last keepalive (as a byte position).")
	descSlotLag      = desc("slot_lag_bytes", "pg_current_wal_lsn() minus the slot's confirmed_flush_lsn, polled every 5 s; absent while the slot monitor has no recent observation.")
	descBehind       = desc("seconds_behind", "Now minus the commit time of the oldest unacknowledged transaction; 0 when idle; absent while not streaming.")
	descRole         = desc("role", "1 for this instance's role for the source: active (streaming, hearing from the server, holding the slot), standby, starting, or paused (by the fleet API).", "role")
	descWALStatus    = desc("slot_wal_status", "1 for the slot's wal_status (reserved, extended, unreserved, lost, missing, or unknown while the monitor has no recent observation).", "status")
	descMonErrors    = desc("slot_monitor_errors_total", "Polls of pg_replication_slots that failed (each leaves the slot's state unknown).")
	descMonSuccess   = desc("slot_monitor_last_success_timestamp_seconds", "When the slot monitor last read the slot (Unix time); absent before the first success.")
	descPausedSince  = desc("paused_since_timestamp_seconds", "When the source was paused through the fleet API (Unix seconds); absent while it is not paused. Its slot is still watched: slot_lag_bytes and slot_wal_status stay known.")
	descSlotActive   = desc("slot_active", "1 when pg_replication_slots shows a walsender on the slot (this instance or another), 0 when none; absent while unknown.")
	descSilence      = desc("server_silence_seconds", "Time since the replication connection last heard from PostgreSQL; absent without a session.")
	descTxns         = desc("kafka_transactions_total", "Kafka transactions of the exactly-once mode, by result: committed or aborted.", "result")
	descCheckpoint   = desc("checkpoint_lsn", "Last checkpoint committed to Kafka or read back at start (exactly-once mode, as a byte position); the slot is never confirmed past it. Absent before the first.")
	descSkipped      = desc("events_skipped_total", "Events the slot sent again that were already in Kafka: below the last checkpoint (exactly-once mode), or acknowledged before the last failure of this process (at-least-once mode).")
	descPhantomRisk  = desc("failover_phantom_risk", "1 while the slot is a failover slot and the primary's synchronized_standby_slots is empty (a failover to a lagging standby would leave phantom events in Kafka), else 0; absent before the first session checked.")
)

// Describe implements prometheus.Collector.
func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDecoded, descMessages, descTransactions, descIgnored, descBytes, descReconnects, descErrors,
		descInFlightRecs, descInFlightWin, descInFlightB, descConfirmed, descWALEnd, descSlotLag, descBehind, descRole, descWALStatus,
		descMonErrors, descMonSuccess, descSilence, descSlotActive, descTxns, descCheckpoint, descSkipped, descPhantomRisk, descPausedSince} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.m.watchedSources() {
		collectSource(ch, src.name, src.health())
	}
}

// collectSource sends one source's metrics.
func collectSource(ch chan<- prometheus.Metric, source string, s pipeline.Health) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{source}, labels...)...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{source}, labels...)...)
	}
	counter(descDecoded, float64(s.Rows))
	counter(descTransactions, float64(s.Transactions))
	counter(descIgnored, float64(s.IgnoredUpdates), "update")
	counter(descIgnored, float64(s.IgnoredDeletes), "delete")
	counter(descIgnored, float64(s.IgnoredTruncates), "truncate")
	counter(descIgnored, float64(s.IgnoredOtherTables), "other_table")
	counter(descIgnored, float64(s.IgnoredMessages), "other_message")
	counter(descMessages, float64(s.Messages))
	counter(descBytes, float64(s.ProducedBytes))
	counter(descReconnects, float64(s.Restarts))
	for _, class := range []string{"postgres", "kafka", "undeliverable"} {
		counter(descErrors, float64(s.Errors[class]), class)
	}
	gauge(descInFlightRecs, float64(s.InFlightRecords))
	gauge(descInFlightB, float64(s.InFlightBytes))
	gauge(descInFlightWin, float64(s.InFlightWindow))
	gauge(descConfirmed, float64(s.ConfirmedLSN))
	gauge(descWALEnd, float64(s.ServerWALEnd))
	counter(descTxns, float64(s.TransactionsCommitted), "committed")
	counter(descTxns, float64(s.TransactionsAborted), "aborted")
	counter(descSkipped, float64(s.SkippedRows))
	if s.CheckpointLSN != 0 {
		gauge(descCheckpoint, float64(s.CheckpointLSN))
	}
	if s.PhantomRiskKnown {
		gauge(descPhantomRisk, b2f(s.PhantomRisk))
	}
	// What is not known now is left out, never shown at its last value.
	if s.SlotKnown && s.Slot.Exists {
		gauge(descSlotLag, float64(s.Slot.LagBytes))
		gauge(descSlotActive, b2f(s.Slot.Active))
	}
	if s.State == pipeline.StateStreaming {
		gauge(descBehind, s.SecondsBehind)
	}
	if !s.LastServerMessage.IsZero() && s.State == pipeline.StateStreaming {
		gauge(descSilence, time.Since(s.LastServerMessage).Seconds())
	}
	counter(descMonErrors, float64(s.SlotMonitorErrors))
	if !s.SlotMonitorLastSuccess.IsZero() {
		gauge(descMonSuccess, float64(s.SlotMonitorLastSuccess.UnixNano())/1e9)
	}
	if s.Paused && !s.PausedSince.IsZero() {
		gauge(descPausedSince, float64(s.PausedSince.UnixNano())/1e9)
	}
	role := "starting"
	switch {
	case s.Paused:
		role = "paused"
	case s.Ready:
		role = "active"
	case s.State == pipeline.StateStandby:
		role = "standby"
	}
	for _, r := range []string{"active", "standby", "starting", "paused"} {
		gauge(descRole, b2f(r == role), r)
	}
	status := s.Slot.WALStatus
	switch {
	case !s.SlotKnown:
		status = "unknown"
	case !s.Slot.Exists:
		status = "missing"
	}
	for _, st := range []string{"reserved", "extended", "unreserved", "lost", "missing", "unknown"} {
		gauge(descWALStatus, b2f(st == status), st)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
