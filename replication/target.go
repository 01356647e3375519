package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// Target is a database to connect to: its URL, and the command that gives the password at each new
// connection (postgres.password_command), for short-lived credentials such as RDS/Aurora IAM tokens or
// Cloud SQL and Azure Entra access tokens.
type Target struct {
	// URL is postgres.url (its password, if any, from postgres.password_file or PGPASSWORD).
	URL string
	// PasswordCommand, when set, runs (sh -c) before every connection; its standard output, without
	// the trailing line break, is the password. It sees the connection's PGHOST, PGPORT, PGUSER and
	// PGDATABASE in its environment. Its output is never logged.
	PasswordCommand string
}

// TargetOf is the target of a source's postgres settings.
func TargetOf(p config.Postgres) Target {
	return Target{URL: p.URL, PasswordCommand: p.PasswordCommand}
}

// At is the target with another URL and the same password command (a standby of the same role).
func (t Target) At(url string) Target { return Target{URL: url, PasswordCommand: t.PasswordCommand} }

// urlError is the error of a postgres.url that cannot be used: a TLS file it names that does not
// exist (yet: a Secret mounted late) is something the operator's side provides while the router
// waits (ErrPending); anything else must be fixed in the configuration.
func urlError(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w: postgres.url names a file that does not exist (sslrootcert, sslcert, sslkey): %w", ErrNotSetUp, ErrPending, err)
	}
	return fmt.Errorf("%w: postgres.url: %w", ErrNotSetUp, err)
}

// passwordCommandTimeout bounds one run of the password command.
const passwordCommandTimeout = 30 * time.Second

// password runs the password command for cfg, a parsed connection configuration, and sets its
// password (no-op without a command).
func (t Target) password(ctx context.Context, cfg *pgconn.Config) error {
	if t.PasswordCommand == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, passwordCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", t.PasswordCommand)
	cmd.Env = append(os.Environ(), "PGHOST="+cfg.Host, "PGPORT="+strconv.Itoa(int(cfg.Port)), "PGUSER="+cfg.User, "PGDATABASE="+cfg.Database)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = nil // never shown: a tool may print what it should not
	if err := cmd.Run(); err != nil {
		why := err.Error()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			why = "exit status " + strconv.Itoa(exit.ExitCode())
		}
		if ctx.Err() != nil {
			why = "no answer within " + passwordCommandTimeout.String()
		}
		return fmt.Errorf("postgres.password_command failed (%s; its output is not shown): run it by hand to see why", why)
	}
	pw := bytes.TrimRight(out.Bytes(), "\r\n")
	if len(pw) == 0 {
		return errors.New("postgres.password_command printed no password")
	}
	cfg.Password = string(pw)
	return nil
}

// Refused reports the server's refusal of the connection itself — no pg_hba entry or no access
// (28000), a wrong password (28P01), no such database (3D000) — which no replay of the stream
// changes, but which an administrator may fix while the router waits.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28000", "28P01", "3D000":
			return true
		}
	}
	return false
}
