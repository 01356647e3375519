package pipeline

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestHoldKeepsEveryRow checks that the rows handed to the router keep their values across chunks,
// and that holding a row does not allocate one object per row.
func TestHoldKeepsEveryRow(t *testing.T) {
	var h handler
	held := make([]*replication.Row, 0, 3*rowChunk+7)
	for i := range cap(held) {
		held = append(held, h.hold(replication.Row{LSN: replication.LSN(i + 1), Table: i % 3}))
	}
	for i, r := range held {
		if r.LSN != replication.LSN(i+1) || r.Table != i%3 {
			t.Fatalf("row %d reads LSN %d table %d, want %d %d", i, r.LSN, r.Table, i+1, i%3)
		}
	}
	if allocs := testing.AllocsPerRun(10*rowChunk, func() { h.hold(replication.Row{LSN: 1}) }); allocs != 0 {
		t.Fatalf("hold allocates %v times per row, want one allocation per %d rows", allocs, rowChunk)
	}
}
