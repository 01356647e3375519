package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Status is what `outbox-cdc status` reports.
type Status struct {
	// Postgres says whether the database answered; when it did not, the slot, publication and outbox
	// are unknown, not missing.
	Postgres PostgresReport `json:"postgres"`
	// Slot, Publication, Outbox and Kafka are the parts of the report.
	Slot        replication.SlotState        `json:"slot"`
	Publication replication.PublicationState `json:"publication"`
	Outbox      replication.OutboxState      `json:"outbox"`
	Kafka       KafkaReport                  `json:"kafka"`
	// Tables are the further outbox tables of the source (the tables list), which share its slot
	// and publication.
	Tables []replication.OutboxState `json:"tables,omitempty"`
	// MessagePrefixes are the prefixes of the WAL messages the source reads (postgres.message_prefixes);
	// a source of messages only has no Outbox table (its Table is empty).
	MessagePrefixes []string `json:"message_prefixes,omitempty"`
	// Checkpoint is the exactly-once mode's last checkpoint; nil in at-least-once mode.
	Checkpoint *CheckpointReport `json:"checkpoint,omitempty"`
	// Failover says whether the slot survives a failover: the primary's settings and each standby
	// of postgres.standby_urls. Nil when the database did not answer.
	Failover *FailoverReport `json:"failover,omitempty"`
	// Healthy is true when Problems is empty; Problems say what is wrong and how to fix it. Warnings
	// are risks that do not make status fail.
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems"`
	Warnings []string `json:"warnings,omitempty"`
}

// PostgresReport says whether the database could be read.
type PostgresReport struct {
	// Target is user@host:port/database (every host of a multi-host URL); Reachable says whether it
	// answered (else Error), and Server which host:port did.
	Target    string `json:"target"`
	Server    string `json:"server,omitempty"`
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
}

// KafkaReport says whether Kafka answers and which routed topics exist.
type KafkaReport struct {
	// Brokers were asked; Reachable says whether one answered (else Error); the topics are those the
	// routing configuration names in advance.
	Brokers       []string `json:"brokers"`
	Reachable     bool     `json:"reachable"`
	Error         string   `json:"error,omitempty"`
	TopicsPresent []string `json:"topics_present"`
	TopicsMissing []string `json:"topics_missing"`
}

// CheckpointReport is the last checkpoint of the slot in Kafka (exactly-once mode).
type CheckpointReport struct {
	// Topic is kafka.checkpoint_topic; Known says whether it could be read (else Error).
	Topic string `json:"topic"`
	Known bool   `json:"known"`
	Error string `json:"error,omitempty"`
	// Found is false when no checkpoint was ever committed for the slot; LSN and Written are the last
	// one's position and time.
	Found   bool           `json:"found"`
	LSN     checkpoint.LSN `json:"lsn"`
	Written time.Time      `json:"written,omitzero"`
	// Timeline and TimelineStart are the timeline the checkpoint was written on and where it began.
	Timeline      uint32         `json:"timeline,omitempty"`
	TimelineStart checkpoint.LSN `json:"timeline_start,omitempty"`
	// Server is the timeline and history of the server the slot is on (IDENTIFY_SYSTEM): with it,
	// status decides exactly as run does where the mode would resume, and whether it would refuse.
	Server *checkpoint.Server `json:"server,omitempty"`
}

// resume is where run would resume from the checkpoint with the slot confirmed at slot, or the error
// it would refuse to start with: the same decision (checkpoint.Start), so status and run never disagree.
func (c *CheckpointReport) resume(slot checkpoint.LSN) (checkpoint.Resume, error) {
	last := &checkpoint.Record{LSN: c.LSN, Written: c.Written, Timeline: c.Timeline, TimelineStart: c.TimelineStart}
	var server checkpoint.Server
	if c.Server != nil {
		server = *c.Server
	}
	return checkpoint.Start(slot, server, last, false)
}

// Thresholds decide what Evaluate counts as unhealthy.
type Thresholds struct {
	// MaxLagBytes is the largest acceptable lag behind pg_current_wal_lsn(); MaxInactive the longest
	// acceptable inactivity of the slot (known on PostgreSQL 17 and later; before, an inactive slot is
	// unhealthy at once).
	MaxLagBytes int64
	MaxInactive time.Duration
}

// GatherStatus reads everything status reports; failures become part of the report.
func GatherStatus(ctx context.Context, cfg config.Config) Status {
	outbox := outboxOf(cfg)
	st := Status{
		Postgres:    PostgresReport{Target: cfg.PostgresTarget()},
		Slot:        replication.SlotState{Name: cfg.Postgres.Slot, InactiveSeconds: -1},
		Publication: replication.PublicationState{Name: cfg.Postgres.Publication},
		Outbox:      replication.OutboxState{Table: outbox.String()},
		Kafka:       KafkaReport{Brokers: cfg.Kafka.Brokers},

		MessagePrefixes: cfg.Postgres.MessagePrefixes,
	}
	if !outbox.HasTable() {
		st.Outbox.Table = ""
	}
	if err := gatherPostgres(ctx, cfg, outbox, &st); err != nil {
		st.Postgres.Error = err.Error()
	}
	gatherKafka(ctx, cfg, &st)
	if cfg.Kafka.ExactlyOnce() {
		st.Checkpoint = gatherCheckpoint(ctx, cfg)
	}
	return st
}

// gatherCheckpoint reads the slot's last checkpoint from Kafka; identifying the slot and the
// server's timeline takes a replication connection (IDENTIFY_SYSTEM, TIMELINE_HISTORY), as run's does.
func gatherCheckpoint(ctx context.Context, cfg config.Config) *CheckpointReport {
	rep := &CheckpointReport{Topic: cfg.Kafka.CheckpointTopic}
	srv, err := identifyServer(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	server := srv.Checkpoint()
	rep.Server = &server
	kctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	last, err := router.ReadCheckpoint(kctx, cfg.Kafka, cfg.Kafka.CheckpointTopic, checkpoint.SlotID{SystemID: srv.SystemID, Database: srv.Database, Slot: cfg.Postgres.Slot}, slog.New(slog.DiscardHandler))
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	rep.Known = true
	if last != nil {
		rep.Found, rep.LSN, rep.Written, rep.Timeline, rep.TimelineStart = true, last.LSN, last.Written, last.Timeline, last.TimelineStart
	}
	return rep
}

// identifyServer asks the server at t who it is over a replication connection of its own.
func identifyServer(ctx context.Context, t replication.Target) (replication.Server, error) {
	conn, err := replication.Connect(ctx, t)
	if err != nil {
		return replication.Server{}, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	return replication.IdentifyServer(ctx, conn)
}

func gatherPostgres(ctx context.Context, cfg config.Config, outbox replication.Outbox, st *Status) error {
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.PostgresTarget(), err)
	}
	defer func() { _ = cat.Close(context.Background()) }()
	st.Postgres.Reachable, st.Postgres.Server = true, cat.Server()
	if st.Slot, err = cat.Slot(ctx, cfg.Postgres.Slot); err != nil {
		return err
	}
	if st.Publication, err = cat.Publication(ctx, cfg.Postgres.Publication); err != nil {
		return err
	}
	if !outbox.HasTable() {
		st.Outbox = replication.OutboxState{} // WAL messages only: no table
	} else if st.Outbox, err = cat.OutboxState(ctx, outbox, cfg.Postgres.Columns.CreatedAt); err != nil {
		return err
	}
	st.Tables = nil
	for _, t := range tablesOf(cfg) {
		state, err := cat.OutboxState(ctx, t, cfg.Postgres.Columns.CreatedAt)
		if err != nil {
			return err
		}
		st.Tables = append(st.Tables, state)
	}
	if st.Failover, err = gatherFailover(ctx, cat, cfg.Postgres.Slot, replication.TargetOf(cfg.Postgres), cfg.Postgres.StandbyURLs); err != nil {
		return err
	}
	st.Failover.trail(st.Slot)
	return nil
}

func gatherKafka(ctx context.Context, cfg config.Config, st *Status) {
	adm, err := router.NewAdmin(cfg.Kafka)
	if err != nil {
		st.Kafka.Error = err.Error()
		return
	}
	defer adm.Close()
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	present, missing, err := adm.Topics(kctx, KnownTopics(cfg)...)
	if err != nil {
		st.Kafka.Error = err.Error()
		return
	}
	st.Kafka.Reachable = true
	st.Kafka.TopicsPresent, st.Kafka.TopicsMissing = present, missing
}

// Evaluate sets Problems (keeping any already there) and Healthy.
func (st *Status) Evaluate(th Thresholds) {
	problems := append([]string(nil), st.Problems...)
	s := st.Slot
	switch {
	case st.Postgres.Error != "":
		// Nothing is known of the slot, the publication or the outbox: say so, and nothing more.
		problems = append(problems, "postgres: "+st.Postgres.Error+" (slot, publication and outbox unknown)")
	case !s.Exists:
		problems = append(problems, fmt.Sprintf("slot %s does not exist: start outbox-cdc run (creates it) or outbox-cdc resync", s.Name))
	case s.WALStatus == "lost":
		problems = append(problems, fmt.Sprintf("slot %s is lost (WAL it needed was removed): events may be missing; recover with outbox-cdc resync", s.Name))
	case s.InvalidationReason != "":
		problems = append(problems, fmt.Sprintf("slot %s was invalidated (%s): events may be missing; recover with outbox-cdc resync", s.Name, s.InvalidationReason))
	case !s.Active && (s.InactiveSeconds < 0 || s.InactiveSeconds > th.MaxInactive.Seconds()):
		since := "(PostgreSQL < 17 does not record since when)"
		if s.InactiveSeconds >= 0 {
			since = fmt.Sprintf("for %s", (time.Duration(s.InactiveSeconds) * time.Second).String())
		}
		problems = append(problems, fmt.Sprintf("slot %s is inactive %s: no router streams from it", s.Name, since))
	}
	if s.ResyncMarker && !s.ResyncRunning {
		problems = append(problems, fmt.Sprintf("a resync of slot %s was interrupted before its snapshot was published: run outbox-cdc resync again", s.Name))
	}
	switch {
	case st.Postgres.Reachable && !st.Publication.Exists && s.Exists:
		problems = append(problems, fmt.Sprintf("publication %s does not exist, but slot %s does: it was dropped after the slot was created, and run refuses to create it again; recover with outbox-cdc resync", st.Publication.Name, s.Name))
	case st.Postgres.Reachable && !st.Publication.Exists:
		problems = append(problems, fmt.Sprintf("publication %s does not exist: start outbox-cdc run (creates it) or outbox-cdc init", st.Publication.Name))
	}
	if s.Exists && s.LagBytes > th.MaxLagBytes {
		problems = append(problems, fmt.Sprintf("slot %s lags %d bytes behind pg_current_wal_lsn() (threshold %d)", s.Name, s.LagBytes, th.MaxLagBytes))
	}
	if !st.Kafka.Reachable {
		problems = append(problems, "kafka unreachable: "+st.Kafka.Error)
	}
	var warnings []string
	if c := st.Checkpoint; c != nil {
		switch {
		case !c.Known:
			problems = append(problems, fmt.Sprintf("checkpoint topic %s could not be read: %s", c.Topic, c.Error))
		case c.Found && s.Exists:
			r, err := c.resume(s.ConfirmedFlush)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("slot %s: run refuses to start: %v", s.Name, err))
			case r.PhantomTo != 0:
				warnings = append(warnings, fmt.Sprintf("the last checkpoint (%s, timeline %d) is past where its timeline ended on this server (%s): Kafka holds phantom events from that range; run resumes at %s",
					c.LSN, c.Timeline, r.PhantomFrom, r.SkipBelow))
			case r.Unrelated:
				warnings = append(warnings, fmt.Sprintf("the last checkpoint was written on timeline %d, which is not in this server's history: run resumes from the slot's position, and records may be delivered twice", c.Timeline))
			}
		}
	}
	fp, fw := st.evaluateFailover()
	problems = append(problems, fp...)
	st.Warnings = append(append(st.Warnings[:0:0], fw...), warnings...)
	st.Problems = problems
	st.Healthy = len(problems) == 0
}

// Scrub passes every text of the report that may quote an error or a URL through hide.
func (st *Status) Scrub(hide func(string) string) {
	for i, p := range st.Problems {
		st.Problems[i] = hide(p)
	}
	for i, w := range st.Warnings {
		st.Warnings[i] = hide(w)
	}
	if f := st.Failover; f != nil {
		for i := range f.Standbys {
			sb := &f.Standbys[i]
			sb.Target, sb.Error = hide(sb.Target), hide(sb.Error)
			for j, p := range sb.Problems {
				sb.Problems[j] = hide(p)
			}
		}
	}
	st.Postgres.Target, st.Postgres.Error, st.Kafka.Error = hide(st.Postgres.Target), hide(st.Postgres.Error), hide(st.Kafka.Error)
}

// WriteJSON writes the report as indented JSON.
func (st Status) WriteJSON(w io.Writer) error {
	emptyLists(reflect.ValueOf(&st).Elem())
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(st)
}

// emptyLists makes every nil slice reachable from v an empty one, so that JSON shows [] where a list
// is expected, never null.
func emptyLists(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			emptyLists(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				emptyLists(f)
			}
		}
	case reflect.Slice:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		}
		for i := range v.Len() {
			emptyLists(v.Index(i))
		}
	}
}

// Print writes the report as a table for people.
func (st Status) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if st.Postgres.Server != "" {
		fmt.Fprintf(tw, "postgres\t%s (connected to %s)\n", st.Postgres.Target, st.Postgres.Server)
	} else {
		fmt.Fprintf(tw, "postgres\t%s\n", st.Postgres.Target)
	}
	if !st.Postgres.Reachable {
		fmt.Fprintf(tw, "  reachable\tno: slot, publication and outbox unknown\n")
	}
	// Each PostgreSQL object: its details, "no" when it does not exist, "unknown" when the database
	// did not answer.
	section := func(kind, name string, exists bool, details func()) {
		fmt.Fprintf(tw, "%s\t%s\n", kind, name)
		switch {
		case !st.Postgres.Reachable:
			fmt.Fprintf(tw, "  exists\tunknown\n")
		case exists:
			details()
		default:
			fmt.Fprintf(tw, "  exists\tno\n")
		}
	}
	s := st.Slot
	section("slot", s.Name, s.Exists, func() {
		active := "no"
		if s.Active {
			active = fmt.Sprintf("yes (pid %d)", s.ActivePID)
		}
		fmt.Fprintf(tw, "  active\t%s\n  wal_status\t%s\n  confirmed_flush_lsn\t%s\n  restart_lsn\t%s\n  WAL held\t%s\n  lag\t%s\n  failover\t%t\n",
			active, s.WALStatus, s.ConfirmedFlush, s.RestartLSN, bytesHuman(s.WALHeldBytes), bytesHuman(s.LagBytes), s.Failover)
	})
	p := st.Publication
	section("publication", p.Name, p.Exists, func() {
		fmt.Fprintf(tw, "  publishes inserts\t%t\n  tables\t%s\n", p.PublishInsert, strings.Join(p.Tables, ", "))
	})
	if len(st.MessagePrefixes) > 0 {
		fmt.Fprintf(tw, "messages\t%s\n  prefixes\t%s\n", "pg_logical_emit_message", strings.Join(st.MessagePrefixes, ", "))
	}
	for _, o := range append([]replication.OutboxState{st.Outbox}, st.Tables...) {
		if o.Table == "" {
			continue // WAL messages only
		}
		section("outbox", o.Table, o.Exists, func() {
			rows := fmt.Sprintf("%d", o.RowEstimate)
			if o.RowsAtLeast {
				rows = "at least " + rows
			}
			oldest := "none (the table is empty)"
			if o.OldestAgeSeconds != nil {
				oldest = (time.Duration(*o.OldestAgeSeconds) * time.Second).String()
			}
			fmt.Fprintf(tw, "  rows\t%s\n  oldest row\t%s\n", rows, oldest)
		})
	}
	k := st.Kafka
	fmt.Fprintf(tw, "kafka\t%s\n  reachable\t%t\n", strings.Join(k.Brokers, ","), k.Reachable)
	if c := st.Checkpoint; c != nil {
		switch {
		case !c.Known:
			fmt.Fprintf(tw, "  checkpoint\tunknown (%s)\n", c.Topic)
		case !c.Found:
			fmt.Fprintf(tw, "  checkpoint\tnone yet (%s)\n", c.Topic)
		default:
			fmt.Fprintf(tw, "  checkpoint\t%s, written %s (%s)\n", c.LSN, c.Written.UTC().Format(time.RFC3339), c.Topic)
		}
	}
	if len(k.TopicsPresent)+len(k.TopicsMissing) > 0 {
		fmt.Fprintf(tw, "  topics present\t%s\n  topics missing\t%s\n", strings.Join(k.TopicsPresent, ", "), strings.Join(k.TopicsMissing, ", "))
	}
	if f := st.Failover; f != nil {
		sss := strings.Join(f.Primary.SynchronizedStandbySlots, ", ")
		if !f.Primary.FailoverSupported() {
			sss = fmt.Sprintf("n/a (PostgreSQL %d has no failover slots)", f.Primary.ServerVersion/10000)
		} else if sss == "" {
			sss = "(empty)"
		}
		fmt.Fprintf(tw, "failover\t\n  synchronized_standby_slots\t%s\n", sss)
		for _, sb := range f.Standbys {
			state := "ready"
			if !sb.Ready {
				state = "NOT READY"
			}
			fmt.Fprintf(tw, "  standby %s\t%s", sb.Target, state)
			if sb.Facts.SlotExists {
				fmt.Fprintf(tw, ", slot synced=%t temporary=%t, trails %s", sb.Facts.SlotSynced, sb.Facts.SlotTemporary, bytesHuman(sb.TrailBytes))
			}
			fmt.Fprintln(tw)
		}
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(tw, "warning\t%s\n", w)
	}
	if st.Healthy {
		fmt.Fprintf(tw, "health\tok\n")
	} else {
		fmt.Fprintf(tw, "health\tUNHEALTHY\n")
		for _, pr := range st.Problems {
			fmt.Fprintf(tw, "  -\t%s\n", pr)
		}
	}
	_ = tw.Flush()
}

func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// SourceStatus is one source's status report, named.
type SourceStatus struct {
	Name string `json:"name"`
	Status
}

// WriteStatuses writes the reports of one or more sources, as JSON or as tables for people. With a
// sources list (fleet) the JSON is {"healthy": ..., "sources": [{"name": ..., <report>}, ...]} and
// each table is headed by its source's name; otherwise the one report is written as it always was.
func WriteStatuses(w io.Writer, all []SourceStatus, fleet, asJSON bool) error {
	if !fleet && len(all) == 1 {
		if asJSON {
			return all[0].WriteJSON(w)
		}
		all[0].Print(w)
		return nil
	}
	if asJSON {
		healthy := true
		for i := range all {
			emptyLists(reflect.ValueOf(&all[i].Status).Elem())
			healthy = healthy && all[i].Healthy
		}
		if all == nil {
			all = []SourceStatus{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Healthy bool           `json:"healthy"`
			Sources []SourceStatus `json:"sources"`
		}{healthy, all})
	}
	for i, s := range all {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "== source %s\n", s.Name)
		s.Print(w)
	}
	return nil
}
