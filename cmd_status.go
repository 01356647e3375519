package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

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
	Slot        SlotReport        `json:"slot"`
	Publication PublicationReport `json:"publication"`
	Outbox      OutboxReport      `json:"outbox"`
	Kafka       KafkaReport       `json:"kafka"`
	// Healthy is true when Problems is empty; Problems say what is wrong and how to fix it.
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems"`
}

// PostgresReport says whether the database could be read.
type PostgresReport struct {
	// Target is user@host:port/database; Reachable says whether it answered (else Error).
	Target    string `json:"target"`
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
}

// SlotReport is the replication slot's state.
type SlotReport struct {
	// Name ... LagBytes mirror pg_replication_slots; WALHeldBytes and LagBytes are measured from
	// restart_lsn and confirmed_flush_lsn to pg_current_wal_lsn().
	Name              string `json:"name"`
	Exists            bool   `json:"exists"`
	Active            bool   `json:"active"`
	ActivePID         int    `json:"active_pid,omitempty"`
	WALStatus         string `json:"wal_status,omitempty"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN        string `json:"restart_lsn,omitempty"`
	WALHeldBytes      int64  `json:"wal_held_bytes"`
	LagBytes          int64  `json:"lag_bytes"`
	// InactiveSeconds is known on PostgreSQL 17 and later (inactive_since); -1 otherwise.
	InactiveSeconds float64 `json:"inactive_seconds"`
	// ResyncInterrupted is true while the marker of an unfinished resync exists.
	ResyncInterrupted bool `json:"resync_interrupted"`
}

// PublicationReport is the publication's state.
type PublicationReport struct {
	// Name, Exists, PublishInsert and Tables mirror pg_publication and pg_publication_tables.
	Name          string   `json:"name"`
	Exists        bool     `json:"exists"`
	PublishInsert bool     `json:"publish_insert"`
	Tables        []string `json:"tables"`
}

// OutboxReport is the outbox table's state.
type OutboxReport struct {
	// Table is the outbox; RowEstimate is pg_class.reltuples; OldestAgeSeconds is now - min(created_at).
	Table            string  `json:"table"`
	Exists           bool    `json:"exists"`
	RowEstimate      int64   `json:"row_estimate"`
	OldestAgeSeconds float64 `json:"oldest_row_age_seconds"`
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

func newStatusCommand() *cobra.Command {
	var (
		asJSON      bool
		maxLag      int64
		maxInactive time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Report the slot, publication, outbox table and Kafka; exit non-zero when unhealthy",
		Long: `status reports the replication slot (exists, active and by which pid, wal_status, confirmed and
restart positions, WAL held, lag behind pg_current_wal_lsn()), the publication and its tables, the
outbox table's row estimate and oldest row, and whether Kafka answers and the topics the routing
configuration names in advance exist.

It exits 1 when unhealthy — slot missing, lost, inactive longer than --max-inactive (PostgreSQL 17
records since when; on older servers an inactive slot is unhealthy at once), lag over --max-lag-bytes,
Kafka unreachable — so it can drive an alert or a readiness probe.`,
		Example: `  outbox-cdc status
  outbox-cdc status --json | jq .slot.lag_bytes
  outbox-cdc status --max-lag-bytes 500000000 || page-the-on-call`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			st := gatherStatus(ctx, cfg)
			st.Problems = evaluate(st, maxLag, maxInactive)
			scrub := scrubber(cfg)
			for i, p := range st.Problems {
				st.Problems[i] = scrub.String(p)
			}
			st.Postgres.Target, st.Postgres.Error, st.Kafka.Error = scrub.String(st.Postgres.Target), scrub.String(st.Postgres.Error), scrub.String(st.Kafka.Error)
			st.Healthy = len(st.Problems) == 0
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
			} else {
				printStatus(cmd.OutOrStdout(), st)
			}
			if !st.Healthy {
				return errUnhealthy
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts")
	cmd.Flags().Int64Var(&maxLag, "max-lag-bytes", 1<<30, "unhealthy when the slot lags pg_current_wal_lsn() by more")
	cmd.Flags().DurationVar(&maxInactive, "max-inactive", 5*time.Minute, "unhealthy when the slot has been inactive longer (PostgreSQL 17+)")
	config.RegisterFlags(cmd.Flags())
	return cmd
}

var errUnhealthy = fmt.Errorf("unhealthy")

// gatherStatus reads everything status reports; failures become part of the report.
func gatherStatus(ctx context.Context, cfg config.Config) Status {
	st := Status{
		Postgres:    PostgresReport{Target: cfg.PostgresTarget()},
		Slot:        SlotReport{Name: cfg.Postgres.Slot, InactiveSeconds: -1},
		Publication: PublicationReport{Name: cfg.Postgres.Publication},
		Outbox:      OutboxReport{Table: cfg.Postgres.Table},
		Kafka:       KafkaReport{Brokers: cfg.Kafka.Brokers},
	}
	if err := gatherPostgres(ctx, cfg, &st); err != nil {
		st.Postgres.Error = err.Error()
	}
	gatherKafka(ctx, cfg, &st)
	return st
}

func gatherPostgres(ctx context.Context, cfg config.Config, st *Status) error {
	db, err := pgx.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.PostgresTarget(), err)
	}
	defer db.Close(context.Background())
	st.Postgres.Reachable = true
	var hasInactiveSince bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'pg_catalog.pg_replication_slots'::regclass AND attname = 'inactive_since')`).Scan(&hasInactiveSince); err != nil {
		return err
	}
	inactive := "-1::float8"
	if hasInactiveSince {
		inactive = "coalesce(extract(epoch FROM now() - inactive_since), -1)::float8"
	}
	s := &st.Slot
	var pid *int
	var walStatus, confirmed, restart *string
	err = db.QueryRow(ctx, `SELECT active, active_pid, wal_status, confirmed_flush_lsn::text, restart_lsn::text,
		coalesce((pg_current_wal_lsn() - restart_lsn)::bigint, 0), coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0), `+inactive+`
		FROM pg_replication_slots WHERE slot_name = $1`, cfg.Postgres.Slot).
		Scan(&s.Active, &pid, &walStatus, &confirmed, &restart, &s.WALHeldBytes, &s.LagBytes, &s.InactiveSeconds)
	switch {
	case err == pgx.ErrNoRows:
	case err != nil:
		return fmt.Errorf("read pg_replication_slots: %w", err)
	default:
		s.Exists = true
		s.ActivePID, s.WALStatus, s.ConfirmedFlushLSN, s.RestartLSN = deref(pid), deref(walStatus), deref(confirmed), deref(restart)
	}
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, replication.ResyncMarker(cfg.Postgres.Slot)).Scan(&s.ResyncInterrupted); err != nil {
		return err
	}
	pub := &st.Publication
	err = db.QueryRow(ctx, `SELECT pubinsert FROM pg_publication WHERE pubname = $1`, cfg.Postgres.Publication).Scan(&pub.PublishInsert)
	if err == nil {
		pub.Exists = true
		rows, err := db.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, cfg.Postgres.Publication)
		if err != nil {
			return err
		}
		pub.Tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
	} else if err != pgx.ErrNoRows {
		return fmt.Errorf("read pg_publication: %w", err)
	}
	schema, table := replication.SplitTable(cfg.Postgres.Table)
	ob := &st.Outbox
	err = db.QueryRow(ctx, `SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, table).Scan(&ob.RowEstimate)
	if err == pgx.ErrNoRows {
		return nil
	}
	if err != nil {
		return err
	}
	ob.Exists = true
	if col := cfg.Postgres.Columns.CreatedAt; col != "" {
		// The outbox is small when applications delete what they insert; bound the scan anyway.
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var age *float64
		q := fmt.Sprintf(`SELECT extract(epoch FROM now() - min(%s))::float8 FROM %s`, pgx.Identifier{col}.Sanitize(), pgx.Identifier{schema, table}.Sanitize())
		if err := db.QueryRow(qctx, q).Scan(&age); err == nil && age != nil {
			ob.OldestAgeSeconds = *age
		}
	}
	return nil
}

func gatherKafka(ctx context.Context, cfg config.Config, st *Status) {
	kopts, err := router.ClientOpts(cfg.Kafka.Brokers, cfg.KafkaSecurity())
	if err != nil {
		st.Kafka.Error = err.Error()
		return
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		st.Kafka.Error = err.Error()
		return
	}
	defer cl.Close()
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(cl).ListTopics(kctx)
	if err != nil {
		st.Kafka.Error = err.Error()
		return
	}
	st.Kafka.Reachable = true
	for _, t := range knownTopics(cfg) {
		if topics.Has(t) {
			st.Kafka.TopicsPresent = append(st.Kafka.TopicsPresent, t)
		} else {
			st.Kafka.TopicsMissing = append(st.Kafka.TopicsMissing, t)
		}
	}
}

// knownTopics are the topics the routing configuration names in advance: the event_type map, the
// fallback and dead-letter topics, and a template without placeholders.
func knownTopics(cfg config.Config) []string {
	set := map[string]bool{}
	for _, t := range cfg.Routing.Topics {
		set[t] = true
	}
	for _, t := range []string{cfg.Routing.FallbackTopic, cfg.Routing.DLQTopic} {
		if t != "" {
			set[t] = true
		}
	}
	if cfg.Routing.Topic != "" && !strings.ContainsAny(cfg.Routing.Topic, "{}") {
		set[cfg.Routing.Topic] = true
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// evaluate lists what makes the status unhealthy.
func evaluate(st Status, maxLag int64, maxInactive time.Duration) []string {
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
	case !s.Active && (s.InactiveSeconds < 0 || s.InactiveSeconds > maxInactive.Seconds()):
		since := "(PostgreSQL < 17 does not record since when)"
		if s.InactiveSeconds >= 0 {
			since = fmt.Sprintf("for %s", (time.Duration(s.InactiveSeconds) * time.Second).String())
		}
		problems = append(problems, fmt.Sprintf("slot %s is inactive %s: no router streams from it", s.Name, since))
	}
	if s.ResyncInterrupted {
		problems = append(problems, fmt.Sprintf("a resync of slot %s was interrupted before its snapshot was published: run outbox-cdc resync again", s.Name))
	}
	if st.Postgres.Reachable && !st.Publication.Exists {
		problems = append(problems, fmt.Sprintf("publication %s does not exist: start outbox-cdc run (creates it) or outbox-cdc init", st.Publication.Name))
	}
	if s.Exists && s.LagBytes > maxLag {
		problems = append(problems, fmt.Sprintf("slot %s lags %d bytes behind pg_current_wal_lsn() (threshold %d)", s.Name, s.LagBytes, maxLag))
	}
	if !st.Kafka.Reachable {
		problems = append(problems, "kafka unreachable: "+st.Kafka.Error)
	}
	return problems
}

func printStatus(w io.Writer, st Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "postgres\t%s\n", st.Postgres.Target)
	if !st.Postgres.Reachable {
		fmt.Fprintf(tw, "  reachable\tno: slot, publication and outbox unknown\n")
	}
	s := st.Slot
	fmt.Fprintf(tw, "slot\t%s\n", s.Name)
	unknown := func() { fmt.Fprintf(tw, "  exists\tunknown\n") }
	switch {
	case !st.Postgres.Reachable:
		unknown()
	case s.Exists:
		active := "no"
		if s.Active {
			active = fmt.Sprintf("yes (pid %d)", s.ActivePID)
		}
		fmt.Fprintf(tw, "  active\t%s\n  wal_status\t%s\n  confirmed_flush_lsn\t%s\n  restart_lsn\t%s\n  WAL held\t%s\n  lag\t%s\n",
			active, s.WALStatus, s.ConfirmedFlushLSN, s.RestartLSN, bytesHuman(s.WALHeldBytes), bytesHuman(s.LagBytes))
	default:
		fmt.Fprintf(tw, "  exists\tno\n")
	}
	p := st.Publication
	fmt.Fprintf(tw, "publication\t%s\n", p.Name)
	switch {
	case !st.Postgres.Reachable:
		unknown()
	case p.Exists:
		fmt.Fprintf(tw, "  publishes inserts\t%t\n  tables\t%s\n", p.PublishInsert, strings.Join(p.Tables, ", "))
	default:
		fmt.Fprintf(tw, "  exists\tno\n")
	}
	o := st.Outbox
	fmt.Fprintf(tw, "outbox\t%s\n", o.Table)
	switch {
	case !st.Postgres.Reachable:
		unknown()
	case o.Exists:
		fmt.Fprintf(tw, "  rows (estimate)\t%d\n  oldest row\t%s\n", o.RowEstimate, (time.Duration(o.OldestAgeSeconds) * time.Second).String())
	default:
		fmt.Fprintf(tw, "  exists\tno\n")
	}
	k := st.Kafka
	fmt.Fprintf(tw, "kafka\t%s\n  reachable\t%t\n", strings.Join(k.Brokers, ","), k.Reachable)
	if len(k.TopicsPresent)+len(k.TopicsMissing) > 0 {
		fmt.Fprintf(tw, "  topics present\t%s\n  topics missing\t%s\n", strings.Join(k.TopicsPresent, ", "), strings.Join(k.TopicsMissing, ", "))
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

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
