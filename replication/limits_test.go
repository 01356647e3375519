package replication

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestServerLimitsNameTheFix: a server limit reached when the slot is created or the replication
// connection opens (by SQLSTATE, whatever the server's language) says which setting to raise or
// what to free; other errors pass unchanged, and the original error stays reachable.
func TestServerLimitsNameTheFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string // "" for unchanged
	}{
		{"slots", &pgconn.PgError{Code: "53400", Message: "all replication slots are in use"}, "max_replication_slots"},
		{"slots, another language", &pgconn.PgError{Code: "53400", Message: "tous les slots de réplication sont utilisés"}, "pg_replication_slots"},
		{"senders", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "53300", Message: "number of requested standby connections exceeds max_wal_senders (currently 10)"}), "max_wal_senders"},
		{"role limit", &pgconn.PgError{Code: "53300", Message: "too many connections for role \"outbox\""}, "CONNECTION LIMIT"},
		{"other", &pgconn.PgError{Code: "42501", Message: "permission denied"}, ""},
		{"not PostgreSQL's", errors.New("dial tcp: connection refused"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withLimitHint(tc.err)
			if !errors.Is(got, tc.err) {
				t.Fatalf("%v does not wrap %v", got, tc.err)
			}
			if tc.want == "" {
				if got.Error() != tc.err.Error() {
					t.Fatalf("%q changed to %q", tc.err, got)
				}
				return
			}
			if !strings.Contains(got.Error(), tc.want) {
				t.Fatalf("%q does not name %s", got, tc.want)
			}
		})
	}
}
