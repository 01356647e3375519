package replication

import (
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-cdc/outbox-cdc/internal/pin"
)

// Column is one column value of an outbox row, as the WAL carried it.
type Column struct {
	// Name is the column's name from the latest Relation message.
	Name string
	// Value is the column's value. Columns the router reads are converted: bytea to its raw bytes,
	// timestamptz and timestamp to RFC 3339 in UTC; every other value, and a timestamp with no RFC
	// 3339 form (infinity), is the text PostgreSQL sent, under the session settings the connection
	// pins (SessionSettings). Nil when Null.
	Value []byte
	// TypeOID is the column's data type; for a column of a domain type, the domain's base type.
	TypeOID uint32
	// Null is true for SQL NULL. (After TypeOID: the two share one word, a column is 48 bytes.)
	Null bool
}

// Row is one inserted outbox row.
type Row struct {
	// Columns are in the table's column order.
	Columns []Column
	// LSN is the WAL position of the insert. Several rows may share one (COPY, multi-row INSERT);
	// it is informational only: only a transaction's end LSN is ever confirmed.
	LSN LSN
	// Table says which outbox table the row was inserted into: 0 for the stream's Options.Outbox
	// (and for a snapshot's rows), i+1 for Options.Tables[i].
	Table int
	// problem, when not empty, says why a column the router reads could not be decoded: the row
	// cannot be delivered as it is (Problem), and goes to the dead-letter topic with this reason.
	problem string
	// problemClass, when problem is set, classes it for the dead-letter metrics (ProblemBadMessage);
	// empty for a column that could not be decoded.
	problemClass string
	// block is the memory the row's pieces were carved from (nil: memory of its own).
	block *pin.Block
	// message marks a row made from a logical decoding message's content (Message).
	message bool
}

// Block returns the block of memory the row shares with the rows read before and after it (nil when
// its memory is its own). A record made from the row keeps the whole block alive while it is in
// flight: the router charges the block to the in-flight byte cap once (package pin).
func (r *Row) Block() *pin.Block { return r.block }

// Value returns the value of the named column and true, or nil and false when the column is NULL or
// the table has no such column.
func (r *Row) Value(name string) ([]byte, bool) {
	for i := range r.Columns {
		if r.Columns[i].Name == name {
			if r.Columns[i].Null {
				return nil, false
			}
			return r.Columns[i].Value, true
		}
	}
	return nil, false
}

// OutboxTable returns Table: which outbox table the row was inserted into (the router routes by it).
func (r *Row) OutboxTable() int { return r.Table }

// TypeOID returns the data type of the named column and true, or false when the table has no such
// column.
func (r *Row) TypeOID(name string) (uint32, bool) {
	for i := range r.Columns {
		if r.Columns[i].Name == name {
			return r.Columns[i].TypeOID, true
		}
	}
	return 0, false
}

// Problem says why a column the router reads could not be decoded, or "" when every one could. A row
// with a problem is undeliverable as it is: the router dead-letters it with this reason (or stops,
// naming it, without a dead-letter topic); it never stops the stream.
func (r *Row) Problem() string { return r.problem }

// ProblemClass classes Problem for the dead-letter metrics: ProblemBadMessage for a logical decoding
// message that cannot become a record, "" for a column that could not be decoded.
func (r *Row) ProblemClass() string { return r.problemClass }

// Message reports whether the row was made from a logical decoding message (Options.MessagePrefixes)
// rather than an insert: its columns are the content's JSON fields, typed by their JSON kind (a
// string as text, a number as numeric, a boolean as bool, an object or array as jsonb), which the
// debezium format writes as Debezium's DecodeLogicalDecodingMessageContent types them.
func (r *Row) Message() bool { return r.message }

// Size is the number of value bytes of the row.
func (r *Row) Size() int {
	n := 0
	for i := range r.Columns {
		n += len(r.Columns[i].Value)
	}
	return n
}

// pinSessionSettings sets, over whatever the URL said, the settings that shape the text of values
// PostgreSQL sends (pgoutput's tuples, a snapshot's rows) and that the decoder relies on. A role or
// database may set any of them (ALTER ROLE ... SET DateStyle = 'SQL, DMY'), and such settings apply to
// replication connections too; sent as startup parameters, these take precedence over them.
func pinSessionSettings(params map[string]string) {
	params["DateStyle"] = "ISO, MDY"
	params["IntervalStyle"] = "postgres"
	params["bytea_output"] = "hex"
	params["TimeZone"] = "UTC"
	params["client_encoding"] = "UTF8"
}

// relation is a cached Relation message.
type relation struct {
	namespace, name string
	columns         []*pglogrepl.RelationMessageColumn
	outbox          bool // one of the configured outbox tables
	table           int  // which one (Row.Table)
	// For the outbox: per column, the base type (a domain's base type, else the column's type) and
	// whether the router reads it (only those are converted).
	types []uint32
	used  []bool
}

// ErrUnreadable is returned (wrapped) when the WAL stream holds a message outbox-cdc cannot read (a
// malformed message, an insert whose columns do not match its Relation message): the server would
// send it again on every replay, so the stream stops naming its position rather than replay forever.
var ErrUnreadable = errors.New("the replication stream holds a message outbox-cdc cannot read")

// decodeTuple turns an insert's tuple into a Row whose columns cols returns (len(tuple) of them),
// aligning columns by index with the relation. A column the router reads that cannot be decoded
// makes the row's Problem, not an error: only a tuple that does not fit its relation is one.
func decodeTuple(types *pgtype.Map, rel *relation, tuple []tupleColumn, cols func(n int) []Column, lsn LSN) (Row, error) {
	if len(tuple) != len(rel.columns) {
		return Row{}, fmt.Errorf("%w: insert into %s.%s has %d columns, its relation message %d", ErrUnreadable, rel.namespace, rel.name, len(tuple), len(rel.columns))
	}
	row := Row{Columns: cols(len(tuple)), LSN: lsn, Table: rel.table}
	for i, col := range tuple {
		rc := rel.columns[i]
		out := Column{Name: rc.Name, TypeOID: rel.types[i]}
		switch col.kind {
		case pglogrepl.TupleDataTypeNull:
			out.Null = true
		case pglogrepl.TupleDataTypeToast:
			// Inserts always carry every value; an unchanged TOAST marker here is a protocol surprise.
			return Row{}, fmt.Errorf("%w: insert into %s.%s: column %s arrived as an unchanged TOAST value", ErrUnreadable, rel.namespace, rel.name, rc.Name)
		case pglogrepl.TupleDataTypeText:
			out.Value = col.data
			if rel.used[i] {
				v, err := convertText(types, out.TypeOID, col.data)
				if err != nil && row.problem == "" {
					row.problem = fmt.Sprintf("column %s: %v", rc.Name, err)
				}
				if err == nil {
					out.Value = v
				}
			}
		default:
			// Binary tuples ('b') come only when START_REPLICATION asks for them, which it does not.
			return Row{}, fmt.Errorf("%w: column %s: tuple data type %q, which this stream never asks for", ErrUnreadable, rc.Name, col.kind)
		}
		row.Columns[i] = out
	}
	return row, nil
}

// convertText turns the text form of a column the router reads into the bytes it forwards: bytea as
// its raw bytes (from either bytea_output format), timestamptz as RFC 3339 in UTC, timestamp (without
// time zone) as RFC 3339 taking its wall time as UTC, everything else as sent. A timestamp with no RFC
// 3339 form (infinity, -infinity) or one it cannot read is passed on as PostgreSQL wrote it: a header
// value, never a reason to hold the stream. Only a bytea value it cannot read is an error.
func convertText(types *pgtype.Map, oid uint32, text []byte) ([]byte, error) {
	switch oid {
	case pgtype.ByteaOID:
		return decodeBytea(text)
	case pgtype.TimestamptzOID:
		if out, ok := isoTimestampToRFC3339(text, true); ok {
			return out, nil
		}
		var ts pgtype.Timestamptz
		if err := types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, text, &ts); err != nil || !ts.Valid || ts.InfinityModifier != pgtype.Finite {
			return text, nil
		}
		return ts.Time.UTC().AppendFormat(nil, time.RFC3339Nano), nil
	case pgtype.TimestampOID:
		if out, ok := isoTimestampToRFC3339(text, false); ok {
			return out, nil
		}
		var ts pgtype.Timestamp
		if err := types.Scan(pgtype.TimestampOID, pgtype.TextFormatCode, text, &ts); err != nil || !ts.Valid || ts.InfinityModifier != pgtype.Finite {
			return text, nil
		}
		t := ts.Time
		return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC).AppendFormat(nil, time.RFC3339Nano), nil
	default:
		return text, nil
	}
}

// isoTimestampToRFC3339 rewrites the text form PostgreSQL gives a timestamp with the session settings
// the connections pin (DateStyle ISO, TimeZone UTC) — "2026-12-05 06:45:18.698028", followed by "+00"
// for a timestamptz (utc) — as RFC 3339 in UTC, exactly as parsing it and formatting it with
// time.RFC3339Nano would, without parsing: the form of every outbox row's created_at, so this is on
// the per-row path. ok is false for any other form (BC dates, years past 9999, other offsets,
// infinity, a fraction with trailing zeros), which the caller then parses.
func isoTimestampToRFC3339(text []byte, utc bool) (out []byte, ok bool) {
	end := len(text)
	if utc {
		if end < 3 || text[end-3] != '+' || text[end-2] != '0' || text[end-1] != '0' {
			return nil, false
		}
		end -= 3
	}
	const layout = "0000-00-00 00:00:00" // 0: a digit
	if end < len(layout) {
		return nil, false
	}
	for i := 0; i < len(layout); i++ {
		if c := text[i]; layout[i] == '0' && (c < '0' || c > '9') || layout[i] != '0' && c != layout[i] {
			return nil, false
		}
	}
	if frac := text[len(layout):end]; len(frac) > 0 {
		// PostgreSQL prints up to six digits and drops trailing zeros, as RFC3339Nano does.
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 7 || frac[len(frac)-1] == '0' {
			return nil, false
		}
		for _, c := range frac[1:] {
			if c < '0' || c > '9' {
				return nil, false
			}
		}
	}
	out = make([]byte, end+1)
	copy(out, text[:end])
	out[10], out[end] = 'T', 'Z'
	return out, true
}

// decodeBytea reads bytea's text form in either output format: hex (\x then two hex digits a byte,
// the default, and what the connections pin) or escape (printable bytes as themselves, \\ for a
// backslash, \ooo in octal for the rest).
func decodeBytea(text []byte) ([]byte, error) {
	if len(text) >= 2 && text[0] == '\\' && text[1] == 'x' {
		out := make([]byte, hex.DecodedLen(len(text)-2))
		if _, err := hex.Decode(out, text[2:]); err != nil {
			return nil, fmt.Errorf("bytea in hex format: %w", err)
		}
		return out, nil
	}
	out := make([]byte, 0, len(text))
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		switch {
		case i+1 < len(text) && text[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(text) && isOctal(text[i+1]) && text[i+1] <= '3' && isOctal(text[i+2]) && isOctal(text[i+3]):
			out = append(out, (text[i+1]-'0')<<6|(text[i+2]-'0')<<3|(text[i+3]-'0'))
			i += 3
		default:
			return nil, fmt.Errorf("bytea in escape format: invalid escape at byte %d", i)
		}
	}
	return out, nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// RowDecoder decodes rows read with SQL in text format (a snapshot) exactly as WAL rows are decoded.
type RowDecoder struct {
	types *pgtype.Map
	used  map[string]bool
}

// NewRowDecoder returns a decoder that converts the named columns (the ones the router reads) and
// passes every other one on as sent.
func NewRowDecoder(used []string) *RowDecoder {
	d := &RowDecoder{types: pgtype.NewMap(), used: make(map[string]bool, len(used))}
	for _, name := range used {
		d.used[name] = true
	}
	return d
}

// Decode builds a Row from column names, base type OIDs and text values (nil = NULL). A column the
// router reads that cannot be decoded makes the row's Problem.
func (d *RowDecoder) Decode(names []string, oids []uint32, values [][]byte) Row {
	used := make([]bool, len(names))
	for i, name := range names {
		used[i] = d.used[name]
	}
	return d.decodeInto(make([]Column, len(names)), names, used, oids, values)
}

// decodeInto is Decode into cols (len(names) long), with used[i] saying whether names[i] is a
// column the router reads: a snapshot looks that up once per cursor, not once per row.
func (d *RowDecoder) decodeInto(cols []Column, names []string, used []bool, oids []uint32, values [][]byte) Row {
	row := Row{Columns: cols}
	for i, name := range names {
		c := Column{Name: name, TypeOID: oids[i], Value: values[i], Null: values[i] == nil}
		if !c.Null && used[i] {
			v, err := convertText(d.types, oids[i], values[i])
			if err == nil {
				c.Value = v
			} else if row.problem == "" {
				row.problem = fmt.Sprintf("column %s: %v", name, err)
			}
		}
		cols[i] = c
	}
	return row
}
