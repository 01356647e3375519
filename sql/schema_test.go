package outboxsql

import (
	"strings"
	"testing"
)

// TestTableDDLMatchesSQLFile keeps init's table identical to sql/outbox.sql's.
func TestTableDDLMatchesSQLFile(t *testing.T) {
	ddl := TableDDL(`"app"."events"`)
	if !strings.HasPrefix(ddl, `CREATE TABLE IF NOT EXISTS "app"."events" (`) || !strings.HasSuffix(ddl, ")") {
		t.Fatalf("unexpected DDL:\n%s", ddl)
	}
	for _, col := range []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "aggregate_version", "payload", "headers", "created_at"} {
		if !strings.Contains(ddl, col) {
			t.Errorf("DDL lacks %s", col)
		}
	}
}
