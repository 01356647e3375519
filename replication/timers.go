package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// A role or a database may set timers meant for application sessions (ALTER ROLE app SET
// statement_timeout = '30s', idle_in_transaction_session_timeout = '60s', ...), and they apply to
// every session of the role, outbox-cdc's too, replication connections included. On outbox-cdc's
// sessions they do harm: statement_timeout and lock_timeout cancel a resync's count, sort or FETCH of
// a large outbox, or one waiting behind a migration's lock; idle_in_transaction_session_timeout ends a
// snapshot transaction that waits its turn while another part of the table is published (and the
// walsender holding an exported snapshot); idle_session_timeout ends the slot monitor's connection
// between its polls (the slot's state turns unknown and /readyz fails every other poll);
// transaction_timeout ends a snapshot transaction that lasts as long as the resync. Like pg_dump,
// outbox-cdc turns all of them off on its own sessions: every statement it runs is bounded by its
// own deadlines instead.

// pinTimers turns off, as startup parameters, the timers every supported server knows.
func pinTimers(params map[string]string) {
	params["statement_timeout"] = "0"
	params["lock_timeout"] = "0"
	params["idle_in_transaction_session_timeout"] = "0"
}

// newerTimersOff turns off the timers only newer servers have (idle_session_timeout since PostgreSQL
// 14, transaction_timeout since 17), those the server knows (current_setting(n, true) is NULL for a
// setting it does not): as startup parameters they would refuse the connection to an older server.
// The statement is constant; it runs over the simple protocol, which replication connections need.
const newerTimersOff = "SELECT pg_catalog.set_config(n, '0', false) FROM (VALUES ('idle_session_timeout'), ('transaction_timeout')) AS t(n) WHERE pg_catalog.current_setting(n, true) IS NOT NULL"

// turnOffNewerTimers runs newerTimersOff on conn, outside any transaction.
func turnOffNewerTimers(ctx context.Context, conn *pgconn.PgConn) error {
	if _, err := conn.Exec(ctx, newerTimersOff).ReadAll(); err != nil {
		return fmt.Errorf("turn off the session's idle_session_timeout and transaction_timeout: %w", err)
	}
	return nil
}
