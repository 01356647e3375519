package replication

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// Column is one column value of an outbox row, as the WAL carried it.
type Column struct {
	// Name is the column's name from the latest Relation message.
	Name string
	// TypeOID is the column's data type.
	TypeOID uint32
	// Value is the column's value: the text form PostgreSQL sends, except bytea, which is decoded to
	// its raw bytes. Nil when Null.
	Value []byte
	// Null is true for SQL NULL.
	Null bool
}

// Row is one inserted outbox row.
type Row struct {
	// Columns are in the table's column order.
	Columns []Column
	// LSN is the WAL position of the insert. Several rows may share one (COPY, multi-row INSERT);
	// it is informational only: only a transaction's end LSN is ever confirmed.
	LSN LSN
}

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

// Size is the number of value bytes of the row.
func (r *Row) Size() int {
	n := 0
	for i := range r.Columns {
		n += len(r.Columns[i].Value)
	}
	return n
}

// relation is a cached Relation message.
type relation struct {
	namespace, name string
	columns         []*pglogrepl.RelationMessageColumn
	outbox          bool // the configured outbox table
}

// decodeTuple turns an insert's tuple into a Row, aligning columns by index with the relation.
func decodeTuple(types *pgtype.Map, rel *relation, tuple []tupleColumn, lsn LSN) (Row, error) {
	if len(tuple) != len(rel.columns) {
		return Row{}, fmt.Errorf("insert into %s.%s has %d columns, its relation message %d", rel.namespace, rel.name, len(tuple), len(rel.columns))
	}
	row := Row{Columns: make([]Column, len(tuple)), LSN: lsn}
	for i, col := range tuple {
		rc := rel.columns[i]
		out := Column{Name: rc.Name, TypeOID: rc.DataType}
		switch col.kind {
		case pglogrepl.TupleDataTypeNull:
			out.Null = true
		case pglogrepl.TupleDataTypeToast:
			// Inserts always carry every value; an unchanged TOAST marker here is a protocol surprise.
			return Row{}, fmt.Errorf("insert into %s.%s: column %s arrived as an unchanged TOAST value", rel.namespace, rel.name, rc.Name)
		case pglogrepl.TupleDataTypeText:
			v, err := decodeText(types, rc.Name, rc.DataType, col.data)
			if err != nil {
				return Row{}, err
			}
			out.Value = v
		case pglogrepl.TupleDataTypeBinary:
			out.Value = col.data
		default:
			return Row{}, fmt.Errorf("column %s: unknown tuple data type %q", rc.Name, col.kind)
		}
		row.Columns[i] = out
	}
	return row, nil
}

// decodeText turns a column's text form into the bytes outbox-cdc forwards: bytea as its raw bytes,
// timestamptz as RFC 3339 in UTC (whatever the server's DateStyle), timestamp (without time zone) as
// RFC 3339 taking its wall time as UTC, everything else as sent.
func decodeText(types *pgtype.Map, name string, oid uint32, text []byte) ([]byte, error) {
	switch oid {
	case pgtype.ByteaOID:
		var b []byte
		if err := types.Scan(pgtype.ByteaOID, pgtype.TextFormatCode, text, &b); err != nil {
			return nil, fmt.Errorf("decode bytea column %s: %w", name, err)
		}
		return b, nil
	case pgtype.TimestamptzOID:
		var ts time.Time
		if err := types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, text, &ts); err != nil {
			return nil, fmt.Errorf("decode timestamptz column %s: %w", name, err)
		}
		return []byte(ts.UTC().Format(time.RFC3339Nano)), nil
	case pgtype.TimestampOID:
		var ts pgtype.Timestamp
		if err := types.Scan(pgtype.TimestampOID, pgtype.TextFormatCode, text, &ts); err != nil {
			return nil, fmt.Errorf("decode timestamp column %s: %w", name, err)
		}
		if ts.InfinityModifier != pgtype.Finite {
			return text, nil // infinity and -infinity have no RFC 3339 form
		}
		return []byte(time.Date(ts.Time.Year(), ts.Time.Month(), ts.Time.Day(), ts.Time.Hour(), ts.Time.Minute(), ts.Time.Second(), ts.Time.Nanosecond(), time.UTC).Format(time.RFC3339Nano)), nil
	default:
		return text, nil
	}
}

// RowDecoder decodes rows read with SQL in text format (a snapshot) exactly as WAL rows are decoded.
type RowDecoder struct {
	types *pgtype.Map
}

// NewRowDecoder returns a decoder.
func NewRowDecoder() *RowDecoder { return &RowDecoder{types: pgtype.NewMap()} }

// Decode builds a Row from column names, type OIDs and text values (nil = NULL).
func (d *RowDecoder) Decode(names []string, oids []uint32, values [][]byte) (Row, error) {
	row := Row{Columns: make([]Column, len(names))}
	for i, name := range names {
		c := Column{Name: name, TypeOID: oids[i]}
		if values[i] == nil {
			c.Null = true
		} else {
			v, err := decodeText(d.types, name, oids[i], values[i])
			if err != nil {
				return Row{}, err
			}
			c.Value = v
		}
		row.Columns[i] = c
	}
	return row, nil
}
