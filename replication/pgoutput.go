package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// The hot path of pgoutput decoding, by hand. pglogrepl decodes an Insert into a pointer per column
// and copies every value byte by byte into its own allocation, and it indexes the message without
// bounds checks (a truncated message panics). Every outbox row is an Insert, so the stream parses
// those here: one bounds-checked pass, the values copied once into one buffer per row. Relation,
// Begin, Commit and the rest (once per transaction or rarer) still go through pglogrepl, behind a
// recover that turns its panics into errors.

// tupleColumn is one column of an Insert's tuple: its kind ('n' null, 'u' unchanged TOAST, 't' text,
// 'b' binary) and, for text and binary, its value.
type tupleColumn struct {
	kind byte
	data []byte
}

// errMalformed marks a pgoutput message that does not parse.
var errMalformed = errors.New("malformed pgoutput message")

// parseInsert parses an Insert message of pgoutput protocol 2 outside a streamed transaction: 'I',
// Int32 relation OID, 'N', then TupleData (Int16 column count; per column a kind byte and, for text
// and binary, an Int32 length and the value). The values are copied once into one buffer, so they
// outlive the connection's read buffer that msg points into: a piece of space (nil: a buffer of
// their own). cols is reused when it has room.
func parseInsert(msg []byte, cols []tupleColumn, space *slab) (uint32, []tupleColumn, error) {
	if len(msg) < 8 || msg[0] != 'I' {
		return 0, cols, fmt.Errorf("%w: Insert of %d bytes", errMalformed, len(msg))
	}
	relID := binary.BigEndian.Uint32(msg[1:5])
	if msg[5] != 'N' {
		return relID, cols, fmt.Errorf("%w: Insert tuple marked %q, want 'N'", errMalformed, msg[5])
	}
	n := int(binary.BigEndian.Uint16(msg[6:8]))
	// One buffer for the whole tuple: the values are subslices of it.
	var body []byte
	if space != nil {
		body = space.take(len(msg) - 8)
	} else {
		body = make([]byte, len(msg)-8)
	}
	copy(body, msg[8:])
	cols = cols[:0]
	at := 0
	for i := range n {
		if at >= len(body) {
			return relID, cols, fmt.Errorf("%w: Insert ends before column %d of %d", errMalformed, i+1, n)
		}
		c := tupleColumn{kind: body[at]}
		at++
		switch c.kind {
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			if len(body)-at < 4 {
				return relID, cols, fmt.Errorf("%w: Insert ends inside the length of column %d", errMalformed, i+1)
			}
			size := binary.BigEndian.Uint32(body[at:])
			at += 4
			if uint64(size) > uint64(len(body)-at) {
				return relID, cols, fmt.Errorf("%w: column %d claims %d bytes, %d remain", errMalformed, i+1, size, len(body)-at)
			}
			c.data = body[at : at+int(size) : at+int(size)]
			at += int(size)
		case pglogrepl.TupleDataTypeNull, pglogrepl.TupleDataTypeToast:
		default:
			return relID, cols, fmt.Errorf("%w: column %d has the unknown kind %q", errMalformed, i+1, c.kind)
		}
		cols = append(cols, c)
	}
	if at != len(body) {
		return relID, cols, fmt.Errorf("%w: %d bytes after the last of %d columns", errMalformed, len(body)-at, n)
	}
	return relID, cols, nil
}

// relationOf reads the relation OID of an Update or Delete message (the four bytes after the type),
// which is all the stream needs of them: it only counts the ones on the outbox.
func relationOf(msg []byte) (uint32, error) {
	if len(msg) < 5 {
		return 0, fmt.Errorf("%w: %q message of %d bytes", errMalformed, msg[0], len(msg))
	}
	return binary.BigEndian.Uint32(msg[1:5]), nil
}

// parseMessage parses any other pgoutput message with pglogrepl, turning a panic on a malformed
// message (pglogrepl does not check lengths everywhere) into an error.
func parseMessage(msg []byte) (m pglogrepl.Message, err error) {
	if len(msg) == 0 {
		return nil, fmt.Errorf("%w: empty", errMalformed)
	}
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("%w: %q message of %d bytes: %v", errMalformed, msg[0], len(msg), r)
		}
	}()
	m, err = pglogrepl.ParseV2(msg, false)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformed, err)
	}
	return m, nil
}
