package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

//go:embed sql/outbox.sql
var outboxSQL string

// facts are what init reads from the server before deciding anything.
type facts struct {
	WALLevel          string
	MaxSlots, Slots   int
	MaxSenders        int
	Senders           int
	Replication       bool // the role has REPLICATION (or is a superuser)
	TableExists       bool
	CanSelect         bool
	PublicationExists bool
	SlotExists        bool
}

// problem is a prerequisite that is not met, with how to fix it.
type problem struct{ what, fix string }

// checkPrerequisites lists what stops outbox-cdc from working on a server with these facts.
// Missing table, publication and slot are not problems: init creates them.
func checkPrerequisites(f facts) []problem {
	var out []problem
	if f.WALLevel != "logical" {
		out = append(out, problem{
			what: fmt.Sprintf("wal_level is %q; logical decoding needs logical", f.WALLevel),
			fix:  "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
		})
	}
	if !f.SlotExists && f.Slots >= f.MaxSlots {
		out = append(out, problem{
			what: fmt.Sprintf("max_replication_slots is %d and %d slots exist: no room for another", f.MaxSlots, f.Slots),
			fix:  fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL (or drop an unused slot)", f.Slots+4),
		})
	}
	if f.MaxSenders <= f.Senders {
		out = append(out, problem{
			what: fmt.Sprintf("max_wal_senders is %d and %d are in use: the router could not connect", f.MaxSenders, f.Senders),
			fix:  fmt.Sprintf("ALTER SYSTEM SET max_wal_senders = %d; then restart PostgreSQL", f.Senders+4),
		})
	}
	if !f.Replication {
		out = append(out, problem{what: "the role lacks the REPLICATION attribute", fix: "ALTER ROLE <role> REPLICATION (as a superuser), or use the role from sql/role.sql"})
	}
	if f.TableExists && !f.CanSelect {
		out = append(out, problem{what: "the role may not SELECT the outbox table (needed by resync and status)", fix: "GRANT SELECT ON <table> TO <role>"})
	}
	return out
}

func newInitCommand() *cobra.Command {
	var dryRun, createTable bool
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Check the database's prerequisites and create the table, publication, slot and topics",
		Long: `init checks what outbox-cdc needs and says exactly what is wrong and how to fix it:
wal_level = logical, room in max_replication_slots and max_wal_senders, the role's REPLICATION
attribute and its SELECT privilege on the outbox table.

It then creates, idempotently, what is missing: the outbox table (only with --create-table, from
sql/outbox.sql), the publication (publish = 'insert'), the replication slot, and the Kafka topics the
routing configuration names in advance (routing.topics, fallback and dead-letter topics). Running it
twice changes nothing the second time. --dry-run prints the SQL and the topics and changes nothing.`,
		Example: `  outbox-cdc init --dry-run
  outbox-cdc init --create-table --dlq-topic outbox.dlq`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			if err := runInit(ctx, cmd.OutOrStdout(), cfg, createTable, dryRun); err != nil {
				return errors.New(scrubber(cfg).String(err.Error()))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the SQL and the topic list, change nothing")
	cmd.Flags().BoolVar(&createTable, "create-table", false, "create the outbox table from sql/outbox.sql when missing")
	config.RegisterFlags(cmd.Flags())
	return cmd
}

var errInitFailed = errors.New("prerequisites not met (see above)")

func runInit(ctx context.Context, w io.Writer, cfg config.Config, createTable, dryRun bool) error {
	db, err := pgx.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.PostgresTarget(), err)
	}
	defer db.Close(context.Background())
	schema, table := replication.SplitTable(cfg.Postgres.Table)
	f, err := readFacts(ctx, db, cfg, schema, table)
	if err != nil {
		return err
	}
	problems := checkPrerequisites(f)
	for _, p := range problems {
		fmt.Fprintf(w, "FIX  %s\n     %s\n", p.what, p.fix)
	}
	if len(problems) > 0 {
		return errInitFailed
	}
	fmt.Fprintf(w, "ok   wal_level=logical, %d of %d replication slots used, %d of %d WAL senders, role has REPLICATION\n",
		f.Slots, f.MaxSlots, f.Senders, f.MaxSenders)

	qualified := pgx.Identifier{schema, table}.Sanitize()
	// Each statement takes its values as parameters (printed beside it in a dry run).
	type statement struct {
		sql  string
		args []any
	}
	var stmts []statement
	if !f.TableExists {
		if !createTable {
			return fmt.Errorf("outbox table %s does not exist: pass --create-table, or apply sql/outbox.sql", cfg.Postgres.Table)
		}
		stmts = append(stmts, statement{sql: tableDDL(qualified)})
	}
	if !f.PublicationExists {
		stmts = append(stmts, statement{sql: replication.CreatePublicationSQL(replication.Outbox{Schema: schema, Table: table, Publication: cfg.Postgres.Publication})})
	}
	if !f.SlotExists {
		stmts = append(stmts, statement{sql: "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", args: []any{cfg.Postgres.Slot}})
	}
	topics := knownTopics(cfg)
	if dryRun {
		fmt.Fprintln(w, "dry run: nothing was changed. SQL that init would run:")
		if len(stmts) == 0 {
			fmt.Fprintln(w, "  (none: table, publication and slot exist)")
		}
		for _, s := range stmts {
			fmt.Fprintf(w, "  %s;", strings.TrimSpace(s.sql))
			if len(s.args) > 0 {
				fmt.Fprintf(w, "  -- with $1 = %q", s.args[0])
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "Kafka topics it would create if missing (%d partitions): %s\n", cfg.Kafka.TopicPartitions, orNone(topics))
		return nil
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("%s: %w", firstLine(s.sql), err)
		}
		fmt.Fprintf(w, "done %s\n", firstLine(s.sql))
	}
	if len(stmts) == 0 {
		fmt.Fprintf(w, "ok   table %s, publication %s and slot %s exist\n", cfg.Postgres.Table, cfg.Postgres.Publication, cfg.Postgres.Slot)
	}
	return createTopics(ctx, w, cfg, topics)
}

func readFacts(ctx context.Context, db *pgx.Conn, cfg config.Config, schema, table string) (facts, error) {
	var f facts
	var maxSlots, maxSenders string
	err := db.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_replication_slots'), current_setting('max_wal_senders'),
		(SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication),
		`+replication.MayReplicateSQL+`,
		EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1),
		EXISTS (SELECT FROM pg_publication WHERE pubname = $2)`, cfg.Postgres.Slot, cfg.Postgres.Publication).
		Scan(&f.WALLevel, &maxSlots, &maxSenders, &f.Slots, &f.Senders, &f.Replication, &f.SlotExists, &f.PublicationExists)
	if err != nil {
		return f, fmt.Errorf("read server settings: %w", err)
	}
	f.MaxSlots, _ = strconv.Atoi(maxSlots)
	f.MaxSenders, _ = strconv.Atoi(maxSenders)
	var oid *uint32
	if err := db.QueryRow(ctx, `SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, table).Scan(&oid); err != nil && err != pgx.ErrNoRows {
		return f, fmt.Errorf("look up the outbox table: %w", err)
	}
	if oid != nil {
		f.TableExists = true
		if err := db.QueryRow(ctx, `SELECT has_table_privilege($1::oid, 'SELECT')`, *oid).Scan(&f.CanSelect); err != nil {
			return f, err
		}
	}
	return f, nil
}

// tableDDL is sql/outbox.sql's CREATE TABLE statement for the configured table.
func tableDDL(qualified string) string {
	start := strings.Index(outboxSQL, "CREATE TABLE")
	end := strings.Index(outboxSQL[start:], ");") + start + 1
	return strings.Replace(outboxSQL[start:end], "public.outbox", qualified, 1)
}

func createTopics(ctx context.Context, w io.Writer, cfg config.Config, topics []string) error {
	if len(topics) == 0 {
		fmt.Fprintln(w, "ok   no topics named in advance (the template's topics are created on first use)")
		return nil
	}
	if !cfg.Kafka.CreateTopics {
		fmt.Fprintf(w, "skip topics (kafka.create_topics is off): %s\n", strings.Join(topics, ", "))
		return nil
	}
	kopts, err := router.ClientOpts(cfg.Kafka.Brokers, cfg.KafkaSecurity())
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, cfg.Kafka.TopicPartitions, cfg.Kafka.TopicReplicationFactor, nil, topics...)
	if err != nil {
		return fmt.Errorf("create topics on %v: %w", cfg.Kafka.Brokers, err)
	}
	for _, t := range topics {
		r := resp[t]
		switch {
		case r.Err == nil:
			fmt.Fprintf(w, "done created topic %s\n", t)
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
			fmt.Fprintf(w, "ok   topic %s exists\n", t)
		default:
			return fmt.Errorf("create topic %s: %w", t, r.Err)
		}
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "(none named in advance)"
	}
	return strings.Join(list, ", ")
}
