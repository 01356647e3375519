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
func decodeTuple(types *pgtype.Map, rel *relation, tuple *pglogrepl.TupleData, lsn LSN) (Row, error) {
	if tuple == nil {
		return Row{}, fmt.Errorf("insert into %s.%s carries no tuple", rel.namespace, rel.name)
	}
	if len(tuple.Columns) != len(rel.columns) {
		return Row{}, fmt.Errorf("insert into %s.%s has %d columns, its relation message %d", rel.namespace, rel.name, len(tuple.Columns), len(rel.columns))
	}
	row := Row{Columns: make([]Column, len(tuple.Columns)), LSN: lsn}
	for i, col := range tuple.Columns {
		rc := rel.columns[i]
		out := Column{Name: rc.Name, TypeOID: rc.DataType}
		switch col.DataType {
		case pglogrepl.TupleDataTypeNull:
			out.Null = true
		case pglogrepl.TupleDataTypeToast:
			// Inserts always carry every value; an unchanged TOAST marker here is a protocol surprise.
			return Row{}, fmt.Errorf("insert into %s.%s: column %s arrived as an unchanged TOAST value", rel.namespace, rel.name, rc.Name)
		case pglogrepl.TupleDataTypeText:
			switch rc.DataType {
			case pgtype.ByteaOID:
				var b []byte
				if err := types.Scan(pgtype.ByteaOID, pgtype.TextFormatCode, col.Data, &b); err != nil {
					return Row{}, fmt.Errorf("decode bytea column %s: %w", rc.Name, err)
				}
				out.Value = b
			case pgtype.TimestamptzOID:
				// Normalise to RFC 3339 in UTC, whatever the server's DateStyle.
				var ts time.Time
				if err := types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, col.Data, &ts); err != nil {
					return Row{}, fmt.Errorf("decode timestamptz column %s: %w", rc.Name, err)
				}
				out.Value = []byte(ts.UTC().Format(time.RFC3339Nano))
			default:
				out.Value = col.Data
			}
		case pglogrepl.TupleDataTypeBinary:
			out.Value = col.Data
		default:
			return Row{}, fmt.Errorf("column %s: unknown tuple data type %q", rc.Name, col.DataType)
		}
		row.Columns[i] = out
	}
	return row, nil
}
