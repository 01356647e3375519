// Package outboxsql holds the SQL files of outbox-cdc: the recommended outbox table and publication
// (outbox.sql), the least-privilege role (role.sql) and a consuming service's inbox (inbox.sql).
// `init` creates the table from outbox.sql; package inbox creates its tables from inbox.sql.
package outboxsql

import (
	_ "embed"
	"strings"
)

// Outbox is sql/outbox.sql: the recommended table, its publication and an example transaction.
//
//go:embed outbox.sql
var Outbox string

// Inbox is sql/inbox.sql: the tables of package inbox, in schema public.
//
//go:embed inbox.sql
var Inbox string

// TableDDL is outbox.sql's CREATE TABLE statement for the table named qualified (already quoted).
func TableDDL(qualified string) string {
	start := strings.Index(Outbox, "CREATE TABLE")
	end := strings.Index(Outbox[start:], ");") + start + 1
	return strings.Replace(Outbox[start:end], "public.outbox", qualified, 1)
}
