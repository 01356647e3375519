package replication

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Outbox events may arrive as transactional logical decoding messages instead of rows:
// pg_logical_emit_message(true, prefix, content) writes the event only into the WAL, inside the
// application's transaction, and pgoutput hands it to the slot in commit order, within that
// transaction, when START_REPLICATION asks for messages (PostgreSQL 14+). A message whose prefix is
// one of Options.MessagePrefixes becomes a Row like an insert: its content is a JSON object whose
// fields are named like the columns (ColumnRole.Column), so that routing, the record formats and
// exactly-once apply unchanged. What cannot become a record — content that is not UTF-8 or not a JSON
// object, a required field missing, a field of the wrong type, a message emitted outside a
// transaction — becomes a Row with a Problem: it is dead-lettered with the reason and the raw content,
// never replayed and never dropped in silence.

// ProblemBadMessage is the Problem class of a message under a configured prefix that cannot become
// a record (Row.ProblemClass).
const ProblemBadMessage = "bad_message"

// handleMessage hands an outbox message (a prefix of Options.MessagePrefixes) to the handler as a
// Row; messages of other prefixes are counted and passed over.
func (s *Stream) handleMessage(ctx context.Context, h Handler, m *pglogrepl.LogicalDecodingMessage, xld pglogrepl.XLogData) error {
	if !slices.Contains(s.opts.MessagePrefixes, m.Prefix) {
		s.counters.IgnoredMessages.Add(1)
		s.reportPassedOver(m)
		return nil
	}
	at := LSN(m.LSN)
	if at == 0 {
		at = LSN(xld.WALStart)
	}
	if !m.Transactional {
		// Emitted with transactional = false: not atomic with any business change, and sent by the
		// server as it decodes it, outside every transaction. It gets a transaction of its own, ending
		// just past it, so that it is dead-lettered (with the reason) and confirmed past like a row.
		if s.current != nil {
			return fmt.Errorf("%w: a non-transactional message at %s inside a transaction", ErrUnreadable, at)
		}
		row := s.messages.row(m.Content, s.opts.Columns, xld.ServerTime, at)
		row.problem = fmt.Sprintf("message with prefix %q was emitted outside a transaction (pg_logical_emit_message(false, ...)): it is not atomic with any business change; emit it with transactional = true", m.Prefix)
		row.problemClass = ProblemBadMessage
		tx := s.tracker.BeginSent(xld.ServerTime, xld.ServerTime, at)
		s.current = tx
		s.counters.Messages.Add(1)
		err := s.deliver(ctx, h, &row)
		s.current = nil
		if err != nil {
			return err
		}
		s.tracker.Commit(tx, at+1)
		s.counters.Transactions.Add(1)
		if b, ok := h.(Batcher); ok {
			s.block()
			defer s.unblock()
			return b.Committed(ctx, tx, at+1)
		}
		return nil
	}
	if s.current == nil {
		return fmt.Errorf("%w: a transactional message at %s outside a transaction", ErrUnreadable, at)
	}
	row := s.messages.row(m.Content, s.opts.Columns, s.current.CommitTime(), at)
	s.counters.Messages.Add(1)
	return s.deliver(ctx, h, &row)
}

// maxReportedPrefixes bounds the prefixes of messages passed over that a stream reports.
const maxReportedPrefixes = 64

// reportPassedOver logs, once per prefix and stream, that a message of a prefix not in
// Options.MessagePrefixes was passed over: the slot moves past it, and if it was an outbox event, it
// is lost for this source. Other tools' messages (Debezium's heartbeats, replication systems) are
// reported the same way, once.
func (s *Stream) reportPassedOver(m *pglogrepl.LogicalDecodingMessage) {
	if s.passedOver[m.Prefix] || len(s.passedOver) >= maxReportedPrefixes {
		return
	}
	if s.passedOver == nil {
		s.passedOver = map[string]bool{}
	}
	s.passedOver[m.Prefix] = true
	prefix := m.Prefix
	if len(prefix) > 64 {
		prefix = prefix[:64] + "…"
	}
	s.log.Warn("passed over a WAL message whose prefix is not in postgres.message_prefixes: the slot moves past it (counted in outbox_cdc_ignored_operations_total{operation=\"other_message\"}); if the application emits outbox events under this prefix, add it to postgres.message_prefixes, and emit only once every instance has it",
		"prefix", strings.ToValidUTF8(prefix, "?"), "transactional", m.Transactional, "configured", s.opts.MessagePrefixes)
}

// serverMajor is the server's major version, from the server_version it reported at connection
// (0 when unknown).
func serverMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version")
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// Column types a message's fields take, so that the record formats treat them as they treat the
// columns of a row (a JSON payload as jsonb, a string as text).
const (
	oidText        = pgtype.TextOID
	oidJSONB       = pgtype.JSONBOID
	oidNumeric     = pgtype.NumericOID
	oidBool        = pgtype.BoolOID
	oidTimestamptz = pgtype.TimestamptzOID
)

// messageRow turns a message's content into a Row with a column per field named by roles (the
// others are not read). commit is the transaction's commit time: created_at when the content has
// none. A content that cannot become a record gives a Row with a Problem and the raw content as its
// payload, so that the dead-letter record carries it.
func (s *messageReader) row(content []byte, roles []ColumnRole, commit time.Time, at LSN) Row {
	row := Row{LSN: at, message: true, Columns: make([]Column, 0, len(roles))}
	bad := func(format string, args ...any) Row {
		cols := []Column{}
		if payload := roleColumn(roles, "postgres.columns.payload"); payload != "" {
			cols = append(cols, Column{Name: payload, Value: bytes.Clone(content), TypeOID: pgtype.ByteaOID})
		}
		return Row{Columns: cols, LSN: at, message: true, problem: fmt.Sprintf(format, args...), problemClass: ProblemBadMessage}
	}
	if !utf8.Valid(content) {
		return bad("message content is not UTF-8")
	}
	// One pass over the content with a validating token reader: the members' raw values, by name
	// (the last of a repeated name wins, as encoding/json and Jackson read it).
	// (A bytes.Buffer is read in place, not copied.)
	dec := s.json
	if dec == nil {
		dec = jsontext.NewDecoder(bytes.NewBuffer(content), jsontext.AllowDuplicateNames(true))
		s.json = dec
	} else {
		dec.Reset(bytes.NewBuffer(content), jsontext.AllowDuplicateNames(true))
	}
	fields := make([]messageMember, 0, len(roles))
	notObject := func() Row {
		if kind := jsontext.Value(bytes.TrimSpace(content)).Kind(); jsontext.Value(content).IsValid() {
			if kind == 'n' {
				return bad("message content is JSON null, not an object with the event's fields")
			}
			return bad("message content is a JSON %s, not an object with the event's fields", jsonKind(bytes.TrimSpace(content)))
		}
		return bad("message content is not JSON")
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return bad("message content is not JSON: %v", err)
	}
	if tok.Kind() != '{' {
		return notObject()
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue()
		if err != nil {
			return bad("message content is not JSON: %v", err)
		}
		key := string(name[1 : len(name)-1])
		if bytes.IndexByte(name, '\\') >= 0 {
			unquoted, err := jsontext.AppendUnquote(nil, name)
			if err != nil {
				return bad("message content is not JSON: %v", err)
			}
			key = string(unquoted)
		}
		v, err := dec.ReadValue()
		if err != nil {
			return bad("message content is not JSON: %v", err)
		}
		if roleColumnNamed(roles, key) {
			// Where the value lies in content, which outlives the decoder's reads.
			end := int(dec.InputOffset())
			m := messageMember{name: key, value: content[end-len(v) : end]}
			if i := slices.IndexFunc(fields, func(m messageMember) bool { return m.name == key }); i >= 0 {
				fields[i] = m
			} else {
				fields = append(fields, m)
			}
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return bad("message content is not JSON: %v", err)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		if jsontext.Value(content).IsValid() || err == nil {
			return bad("message content holds more than one JSON value")
		}
		return bad("message content is not JSON: %v", err)
	}
	for _, role := range roles {
		if role.Column == "" || slices.ContainsFunc(row.Columns, func(c Column) bool { return c.Name == role.Column }) {
			continue
		}
		i := slices.IndexFunc(fields, func(m messageMember) bool { return m.name == role.Column })
		present := i >= 0
		if !present || jsontext.Value(fields[i].value).Kind() == 'n' {
			// Absent is not there at all; null is there, as SQL NULL is in a row (a null payload is a
			// tombstone, as a NULL payload column is).
			switch {
			case role.Key == "postgres.columns.created_at":
				row.Columns = append(row.Columns, Column{Name: role.Column, Value: commit.UTC().AppendFormat(nil, time.RFC3339Nano), TypeOID: oidTimestamptz})
			case !present && role.Required && role.Key != "postgres.columns.timestamp":
				return bad("message content lacks field %q (%s), which every event needs", role.Column, role.Key)
			default:
				row.Columns = append(row.Columns, Column{Name: role.Column, Null: true})
			}
			continue
		}
		col, problem := messageField(role, fields[i].value)
		if problem != "" {
			return bad("message field %q (%s): %s", role.Column, role.Key, problem)
		}
		row.Columns = append(row.Columns, col)
	}
	return row
}

// messageReader turns messages' contents into Rows, reusing its JSON reader. The zero value is ready
// for use; not safe for concurrent use.
type messageReader struct {
	json *jsontext.Decoder
}

// messageRow is a messageReader's row, for one content.
func messageRow(content []byte, roles []ColumnRole, commit time.Time, at LSN) Row {
	var r messageReader
	return r.row(content, roles, commit, at)
}

// messageMember is a member of a message's content that a role reads: its name and raw JSON value
// (valid, without surrounding space; a part of the content, not its own memory).
type messageMember struct {
	name  string
	value []byte
}

// roleColumnNamed reports whether a role reads the column name.
func roleColumnNamed(roles []ColumnRole, name string) bool {
	return slices.ContainsFunc(roles, func(r ColumnRole) bool { return r.Column == name })
}

// messageField converts one field of a message (v: its raw JSON, which the column copies) to a column: a string to its text, a number or a
// boolean to its text (as PostgreSQL writes them), and an object or array to its JSON where the role
// takes JSON (payload, headers, trace context).
func messageField(role ColumnRole, v json.RawMessage) (Column, string) {
	col := Column{Name: role.Column}
	kind := jsonKind(v)
	takesJSON := role.Key == "postgres.columns.payload" || role.Key == "postgres.columns.headers" || role.Key == "postgres.columns.trace_context"
	switch {
	case kind == "string":
		s, err := jsontext.AppendUnquote(make([]byte, 0, len(v)-2), v)
		if err != nil {
			return col, fmt.Sprintf("a string that cannot be read: %v", err)
		}
		if role.Key == "postgres.columns.headers" {
			return col, "a JSON object of header names to values expected, got a string"
		}
		col.Value, col.TypeOID = s, oidText
	case role.Key == "postgres.columns.headers" && kind != "object":
		return col, fmt.Sprintf("a JSON object of header names to values expected, got %s", article(kind))
	case takesJSON:
		col.Value, col.TypeOID = bytes.Clone(v), oidJSONB
	case kind == "number":
		col.Value, col.TypeOID = bytes.Clone(v), oidNumeric
	case kind == "boolean":
		col.Value, col.TypeOID = bytes.Clone(v), oidBool
	default:
		return col, fmt.Sprintf("a string expected, got %s", article(kind))
	}
	return col, ""
}

// jsonKind names the kind of a JSON value by its first byte.
func jsonKind(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func article(kind string) string {
	if strings.IndexByte("aeiou", kind[0]) >= 0 {
		return "an " + kind
	}
	return "a " + kind
}

// roleColumn returns the column of the role set by key, or "".
func roleColumn(roles []ColumnRole, key string) string {
	for _, r := range roles {
		if r.Key == key {
			return r.Column
		}
	}
	return ""
}
