// Command outbox-cdc streams committed inserts into a PostgreSQL outbox table to Kafka, in commit
// order, through a logical replication slot that advances only after Kafka has acknowledged.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/buildinfo"
	"github.com/outbox-cdc/outbox-cdc/internal/memlimit"
	"github.com/outbox-cdc/outbox-cdc/internal/redact"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		// Errors that carry configuration are scrubbed where the configuration is known; this is the
		// last line of defence for anything shaped like a password.
		fmt.Fprintln(os.Stderr, "outbox-cdc:", redact.NewScrubber().String(err.Error()))
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "outbox-cdc",
		Short: "Stream a PostgreSQL outbox table to Kafka from the WAL, at least once and in commit order",
		Long: `outbox-cdc reads committed inserts into an outbox table from PostgreSQL's WAL through a
logical replication slot (pgoutput), sends each row to the Kafka topic chosen by its event_type,
and advances the slot only after Kafka has acknowledged. Rows may be deleted in the transaction
that inserted them: the WAL still carries them.

Configuration comes from a YAML file (--config), overridden by OUTBOX_CDC_* environment variables,
overridden by flags.`,
		Version:       buildinfo.Read().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("config", "", "YAML configuration file ($OUTBOX_CDC_CONFIG)")
	root.AddCommand(newRunCommand(), newResyncCommand(), newStatusCommand(), newInitCommand(), newVersionCommand(), newConfigCommand(), newFromDebeziumCommand())
	return root
}

// loadConfig builds the configuration of a command from its --config file, the environment and its
// flags. Its error never holds a secret of the configuration.
func loadConfig(cmd *cobra.Command) (config.Config, error) {
	path, _ := cmd.Flags().GetString("config")
	if path == "" {
		path = os.Getenv("OUTBOX_CDC_CONFIG")
	}
	cfg, err := config.Load(path, os.LookupEnv, cmd.Flags())
	if err != nil {
		return cfg, errors.New(scrubber(cfg).String(err.Error()))
	}
	return cfg, nil
}

// scrubber hides cfg's secrets, and anything shaped like a password, in text meant for people.
func scrubber(cfg config.Config) *redact.Scrubber { return redact.NewScrubber(cfg.Secrets()...) }

// newLogger returns the operator's logger: text on a terminal, JSON otherwise, unless the
// configuration says; no secret of cfg reaches it, whatever the shape of the message.
func newLogger(w io.Writer, cfg config.Config) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Log.Level)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	format := cfg.Log.Format
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			format = "text"
		}
	}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if format == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(redact.NewHandler(h, scrubber(cfg)))
}

// errExit is returned for failures already reported in the log.
var errExit = errors.New("stopped on error (see the log above)")

// pickSources returns the sources a command acts on: those named (--source), else every source of
// the configuration. With one, the command needs exactly one: with a sources list, --source must
// name it.
func pickSources(cfg config.Config, names []string, one bool) ([]config.Config, error) {
	if len(names) == 0 {
		all := cfg.Sources()
		if one && len(all) > 1 {
			list := make([]string, len(all))
			for i, s := range all {
				list[i] = s.Name
			}
			return nil, fmt.Errorf("--source: the configuration has %d sources (%s): name the one to act on", len(all), strings.Join(list, ", "))
		}
		return all, nil
	}
	if one && len(names) > 1 {
		return nil, fmt.Errorf("--source: this command acts on one source, got %d", len(names))
	}
	var out []config.Config
	for _, name := range names {
		s, err := cfg.Source(name)
		if err != nil {
			return nil, fmt.Errorf("--source: %w", err)
		}
		out = append(out, s)
	}
	return out, nil
}

// applyMemoryLimit gives the Go runtime a soft memory limit of memlimit.Ratio of the container's
// memory limit (unless GOMEMLIMIT is set), and says so; a limit it cannot read is only logged.
func applyMemoryLimit(log *slog.Logger) {
	limit, err := memlimit.Limit("/")
	if err != nil {
		log.Warn("could not read the container's memory limit; the Go runtime has no soft limit (set GOMEMLIMIT)", "error", err.Error())
		return
	}
	if soft := memlimit.Apply(limit, os.Getenv); soft > 0 {
		log.Info("the Go runtime's soft memory limit follows the container's", "container_limit_bytes", limit, "gomemlimit_bytes", soft)
	}
}
