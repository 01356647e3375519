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

// Emit is sql/outbox_emit.sql: the function outbox_emit, which writes an event as a transactional
// WAL message (postgres.message_prefixes).
//
//go:embed outbox_emit.sql
var Emit string

// EmitTemplate is Emit as a template of PostgreSQL's format(): %I the schema, %L the prefix. The
// server quotes both (no value is spliced into SQL here).
func EmitTemplate() string {
	ddl := Emit[strings.Index(Emit, "CREATE OR REPLACE FUNCTION"):]
	ddl = strings.Replace(ddl, "public.outbox_emit", "%I.outbox_emit", 1)
	return strings.Replace(ddl, "pg_logical_emit_message(true, 'outbox',", "pg_logical_emit_message(true, %L,", 1)
}

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
