package fleet

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestHeals: only a missing database or a refused role is started again after a wait; a row, the
// outbox, the slot or Kafka's configuration holds the source (starting it again would replay up to
// the same stop).
func TestHeals(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "3D000"}), true},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01"}), true},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28000"}), true},
		{fmt.Errorf("stream: %w", &pgconn.PgError{Code: "55000"}), false},
		{errors.New("the outbox table changed under the stream"), false},
		{fmt.Errorf("%w: %w: publication \"p\" does not include public.b", replication.ErrNotSetUp, replication.ErrPending), true},
		{fmt.Errorf("%w: postgres.failover_slot is on, but PostgreSQL 16 has no failover slots", replication.ErrNotSetUp), false},
	}
	for _, tt := range tests {
		if got := heals(tt.err); got != tt.want {
			t.Errorf("heals(%v) = %t, want %t", tt.err, got, tt.want)
		}
	}
	// A table this instance's configuration lacks: offered to the other instances, tried again later.
	unlisted := fmt.Errorf("%w: %w: an insert into public.b", replication.ErrOutboxChanged, replication.ErrUnlistedTable)
	if !local(unlisted) || local(errors.New("the outbox table changed under the stream")) {
		t.Error("local() misjudges a table this instance does not list")
	}
}
