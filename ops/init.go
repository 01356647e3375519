// Package ops is the logic of the operator commands `init` and `status`, on top of replication/
// (every question to PostgreSQL) and router/ (every question to Kafka): the cobra commands only parse
// flags, call one function and print its result, and the logic is testable without the binary.
package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	outboxsql "github.com/outbox-cdc/outbox-cdc/sql"
)

// Problem is a prerequisite that is not met, with how to fix it.
type Problem struct {
	// What is wrong; Fix says how to make it right.
	What, Fix string
}

// CheckPrerequisites lists what stops outbox-cdc from working on a server with these facts. A
// missing table, publication or slot is not a problem: init creates them.
func CheckPrerequisites(f replication.Prerequisites) []Problem {
	var out []Problem
	fix := platformFixes(f.Platform)
	if f.WALLevel != "logical" {
		out = append(out, Problem{
			What: fmt.Sprintf("wal_level is %q; logical decoding needs logical", f.WALLevel),
			Fix:  fix.walLevel,
		})
	}
	if !f.SlotExists && f.Slots >= f.MaxSlots {
		out = append(out, Problem{
			What: fmt.Sprintf("max_replication_slots is %d and %d slots exist: no room for another", f.MaxSlots, f.Slots),
			Fix:  fmt.Sprintf(fix.setting, "max_replication_slots", f.Slots+4) + " (or drop an unused slot)",
		})
	}
	if f.MaxSenders <= f.Senders {
		out = append(out, Problem{
			What: fmt.Sprintf("max_wal_senders is %d and %d are in use: the router could not connect", f.MaxSenders, f.Senders),
			Fix:  fmt.Sprintf(fix.setting, "max_wal_senders", f.Senders+4),
		})
	}
	if !f.Replication {
		out = append(out, Problem{What: "the role lacks the REPLICATION attribute", Fix: fix.replication})
	}
	if f.TableExists && !f.CanSelect {
		out = append(out, Problem{What: "the role may not SELECT the outbox table (needed by resync and status)", Fix: "GRANT SELECT ON <table> TO <role>"})
	}
	return out
}

// fixes say how a platform sets what outbox-cdc needs: wal_level, a setting (%s name, %d value), and
// the right to stream.
type fixes struct{ walLevel, setting, replication string }

// platformFixes are the fixes of a managed service (replication.Platform*), or of a server of one's own.
func platformFixes(platform string) fixes {
	switch platform {
	case replication.PlatformRDS:
		return fixes{
			walLevel:    "set rds.logical_replication = 1 in the instance's DB parameter group, then reboot the instance (RDS then sets wal_level = logical)",
			setting:     "set %s = %d in the instance's DB parameter group, then reboot the instance",
			replication: "GRANT rds_replication TO <role> (as the master user), or use the role from sql/role.sql with that grant",
		}
	case replication.PlatformAurora:
		return fixes{
			walLevel:    "set rds.logical_replication = 1 in the DB cluster parameter group, then reboot the writer instance",
			setting:     "set %s = %d in the DB cluster parameter group, then reboot the writer instance",
			replication: "GRANT rds_replication TO <role> (as the master user)",
		}
	case replication.PlatformCloudSQL:
		return fixes{
			walLevel:    "set the database flag cloudsql.logical_decoding = on (gcloud sql instances patch <instance> --database-flags=cloudsql.logical_decoding=on; the instance restarts)",
			setting:     "set the database flag %s = %d (gcloud sql instances patch <instance> --database-flags=...; the instance restarts)",
			replication: "ALTER USER <role> WITH REPLICATION (as a member of cloudsqlsuperuser, e.g. the postgres user)",
		}
	case replication.PlatformAzure:
		return fixes{
			walLevel:    "set the server parameter wal_level = logical (az postgres flexible-server parameter set --name wal_level --value logical), then restart the server",
			setting:     "set the server parameter %s = %d (az postgres flexible-server parameter set), then restart the server",
			replication: "ALTER ROLE <role> WITH REPLICATION (as a member of azure_pg_admin, e.g. the administrator)",
		}
	}
	return fixes{
		walLevel:    "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
		setting:     "ALTER SYSTEM SET %s = %d; then restart PostgreSQL",
		replication: "ALTER ROLE <role> REPLICATION (as a superuser), or use the role from sql/role.sql",
	}
}

// ErrPrerequisites is returned by Init when a prerequisite is not met (the output says which).
var ErrPrerequisites = errors.New("prerequisites not met (see above)")

// InitOptions say what Init may do.
type InitOptions struct {
	// CreateTable creates the outbox table from sql/outbox.sql when it is missing.
	CreateTable bool
	// DryRun prints the SQL and the topics and changes nothing.
	DryRun bool
}

// Init checks the prerequisites and creates, idempotently, what is missing: the outbox table (with
// CreateTable), the publication, the slot, and the topics the routing configuration names in
// advance. It reports each step on w.
func Init(ctx context.Context, w io.Writer, cfg config.Config, o InitOptions) error {
	// What run refuses in the configuration alone (the routing rules), init refuses too.
	if _, err := pipeline.New(cfg, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.PostgresTarget(), err)
	}
	defer func() { _ = cat.Close(context.Background()) }()
	outbox := outboxOf(cfg)
	f, err := cat.Prerequisites(ctx, outbox, cfg.Postgres.Slot)
	if err != nil {
		return err
	}
	problems := CheckPrerequisites(f)
	for _, p := range problems {
		fmt.Fprintf(w, "FIX  %s\n     %s\n", p.What, p.Fix)
	}
	if len(problems) > 0 {
		return ErrPrerequisites
	}
	fmt.Fprintf(w, "ok   wal_level=logical, %d of %d replication slots used, %d of %d WAL senders, role has REPLICATION\n",
		f.Slots, f.MaxSlots, f.Senders, f.MaxSenders)

	// Each step is the statement it runs (printed in a dry run) and the function that runs it.
	type step struct {
		sql string
		run func() error
	}
	var steps []step
	if !f.TableExists {
		if !o.CreateTable {
			return fmt.Errorf("outbox table %s does not exist: pass --create-table, or apply sql/outbox.sql", cfg.Postgres.Table)
		}
		ddl := outboxsql.TableDDL(pgx.Identifier{outbox.Schema, outbox.Table}.Sanitize())
		steps = append(steps, step{ddl, func() error { return cat.CreateTable(ctx, ddl) }})
	}
	more := tablesOf(cfg)
	for _, t := range more {
		exists, err := cat.TableExists(ctx, t)
		if err != nil {
			return err
		}
		if exists {
			continue
		}
		if !o.CreateTable {
			return fmt.Errorf("outbox table %s (tables) does not exist: pass --create-table, or apply sql/outbox.sql with its name", t)
		}
		ddl := outboxsql.TableDDL(pgx.Identifier{t.Schema, t.Table}.Sanitize())
		steps = append(steps, step{ddl, func() error { return cat.CreateTable(ctx, ddl) }})
	}
	if !f.PublicationExists && f.SlotExists {
		return replication.MissingPublicationError(outbox, cfg.Postgres.Slot)
	}
	if !f.PublicationExists {
		stmt, err := cat.PublicationSQL(ctx, outbox, more...)
		if err != nil {
			return err
		}
		steps = append(steps, step{stmt, func() error { return cat.CreatePublication(ctx, outbox, more...) }})
	} else {
		// A table added to the tables list: its inserts are streamed from the ALTER's commit on (rows
		// already in it are not: resync replays them).
		pub, err := cat.Publication(ctx, outbox.Publication)
		if err != nil {
			return err
		}
		for _, t := range more {
			if !slices.Contains(pub.Tables, t.String()) {
				stmt := replication.AddTableSQL(t)
				steps = append(steps, step{stmt, func() error { return cat.AddTable(ctx, t) }})
			}
		}
	}
	if !f.SlotExists {
		steps = append(steps, step{fmt.Sprintf("%s  -- with $1 = %q", replication.CreateSlotSQL, cfg.Postgres.Slot), func() error {
			failover, err := cat.WantFailover(ctx, cfg.Postgres.FailoverSlot)
			if err != nil {
				return err
			}
			_, err = cat.CreateSlot(ctx, cfg.Postgres.Slot, failover)
			return err
		}})
	}
	if len(cfg.Postgres.MessagePrefixes) > 0 {
		// The helper applications call to write an event as a WAL message (sql/outbox_emit.sql).
		exists, err := cat.EmitFunctionExists(ctx, outbox.Schema)
		if err != nil {
			return err
		}
		if !exists {
			ddl, err := cat.EmitFunctionSQL(ctx, outboxsql.EmitTemplate(), outbox.Schema, cfg.Postgres.MessagePrefixes[0])
			if err != nil {
				return err
			}
			steps = append(steps, step{ddl, func() error { return cat.CreateEmitFunction(ctx, ddl) }})
		}
	}
	topics := KnownTopics(cfg)
	if o.DryRun {
		fmt.Fprintln(w, "dry run: nothing was changed. SQL that init would run:")
		if len(steps) == 0 {
			fmt.Fprintln(w, "  (none: table, publication and slot exist)")
		}
		for _, s := range steps {
			fmt.Fprintf(w, "  %s;\n", strings.TrimSpace(s.sql))
		}
		fmt.Fprintf(w, "Kafka topics it would create if missing (%d partitions): %s\n", cfg.Kafka.TopicPartitions, orNone(topics))
		if cfg.Kafka.ExactlyOnce() {
			fmt.Fprintf(w, "exactly-once checkpoint topic it would create if missing (compacted, 1 partition): %s\n", cfg.Kafka.CheckpointTopic)
		}
		if len(steps) == 0 {
			// Everything exists: what run would say of it.
			if err := preflight(ctx, w, cfg, false); err != nil {
				return err
			}
		}
		return reportFailover(ctx, w, cat, cfg)
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			return err
		}
		fmt.Fprintf(w, "done %s\n", firstLine(s.sql))
	}
	if len(steps) == 0 {
		fmt.Fprintf(w, "ok   table %s, publication %s and slot %s exist\n", strings.Join(append([]string{cfg.Postgres.Table}, tableNames(cfg)...), ", "), cfg.Postgres.Publication, cfg.Postgres.Slot)
	}
	if err := reportFailover(ctx, w, cat, cfg); err != nil {
		return err
	}
	if err := createTopics(ctx, w, cfg, topics); err != nil {
		return err
	}
	return preflight(ctx, w, cfg, true)
}

// ErrRunWouldRefuse is returned by Init when run would refuse to start with what exists (the output
// says why and what to do).
var ErrRunWouldRefuse = errors.New("run would refuse to start (see above)")

// preflight reports what run would say of the table, publication and slot init leaves: its warnings,
// or the error it would stop with (then init fails too).
func preflight(ctx context.Context, w io.Writer, cfg config.Config, createCheckpointTopic bool) error {
	warnings, err := pipeline.Preflight(ctx, cfg, slog.New(slog.DiscardHandler), createCheckpointTopic)
	for _, warning := range warnings {
		fmt.Fprintf(w, "warn %s\n", warning)
	}
	if err != nil {
		fmt.Fprintf(w, "FIX  %v\n", err)
		return ErrRunWouldRefuse
	}
	if cfg.Kafka.ExactlyOnce() && createCheckpointTopic {
		fmt.Fprintf(w, "ok   checkpoint topic %s, and the slot's checkpoint agrees with the slot\n", cfg.Kafka.CheckpointTopic)
	}
	fmt.Fprintln(w, "ok   run's own checks pass: it can start")
	return nil
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
	adm, err := router.NewAdmin(cfg.Kafka)
	if err != nil {
		return err
	}
	defer adm.Close()
	created, err := adm.CreateTopics(ctx, topics...)
	for _, t := range topics {
		switch {
		case slices.Contains(created, t):
			fmt.Fprintf(w, "done created topic %s\n", t)
		case err == nil:
			fmt.Fprintf(w, "ok   topic %s exists\n", t)
		}
	}
	return err
}

// KnownTopics are the topics the routing configuration names in advance: the event_type map, the
// fallback and dead-letter topics, and a template without placeholders, of every outbox table.
func KnownTopics(cfg config.Config) []string {
	set := map[string]bool{}
	routings := []config.Routing{cfg.Routing}
	if tables, err := cfg.OutboxTables(); err == nil { // validated with the configuration
		for _, t := range tables[1:] {
			routings = append(routings, t.Routing)
		}
	}
	for _, r := range routings {
		for _, t := range r.Topics {
			set[t] = true
		}
		for _, t := range []string{r.FallbackTopic, r.DLQTopic} {
			if t != "" {
				set[t] = true
			}
		}
		if r.Topic != "" && !strings.ContainsAny(r.Topic, "{}") {
			set[r.Topic] = true
		}
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// outboxOf names the configured outbox table and publication.
func outboxOf(cfg config.Config) replication.Outbox {
	schema, table := replication.SplitTable(cfg.Postgres.Table)
	return replication.Outbox{Schema: schema, Table: table, Publication: cfg.Postgres.Publication}
}

// tablesOf names the further outbox tables (the tables list), each with the publication.
func tablesOf(cfg config.Config) []replication.Outbox {
	var out []replication.Outbox
	for _, t := range cfg.Tables {
		schema, table := replication.SplitTable(t.Name)
		out = append(out, replication.Outbox{Schema: schema, Table: table, Publication: cfg.Postgres.Publication})
	}
	return out
}

// tableNames are the names of the tables list.
func tableNames(cfg config.Config) []string {
	var out []string
	for _, t := range cfg.Tables {
		out = append(out, t.Name)
	}
	return out
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
