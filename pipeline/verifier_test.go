package pipeline

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestVerifierConfirmsOnlyWhatALaterCheckSaw: a commit is in the WAL before it is visible, so a check
// can read a position past a publication change it cannot see yet. The confirm limit therefore moves
// only to the position of the check before the latest one, never to the latest one's; and a check
// that does not continue the last one (the table removed and added back) stops without moving it.
func TestVerifierConfirmsOnlyWhatALaterCheckSaw(t *testing.T) {
	o := replication.Outbox{Schema: "public", Table: "outbox", Publication: "pub"}
	at := func(lsn checkpoint.LSN) replication.Verification {
		return replication.Verification{LSN: lsn, TableOID: 10, PublicationOID: 20, Membership: []string{"table:30"}}
	}
	v := &verifier{outbox: o, log: slog.New(slog.DiscardHandler), obs: &observed{}, last: at(100)}
	r := rand.New(rand.NewPCG(1, 2))
	lsn, prev := checkpoint.LSN(100), checkpoint.LSN(100)
	for range 200 {
		lsn += checkpoint.LSN(r.IntN(1000))
		if err := v.accept(at(lsn)); err != nil {
			t.Fatal(err)
		}
		if got := v.confirmLimit(); got != prev {
			t.Fatalf("after a check at %s the limit is %s, want the previous check's %s", lsn, got, prev)
		}
		prev = lsn
	}
	before := v.confirmLimit()
	moved := at(lsn + 50)
	moved.Membership = []string{"table:31"}
	if err := v.accept(moved); !errors.Is(err, replication.ErrOutboxChanged) {
		t.Fatalf("a check with new membership rows gave %v, want ErrOutboxChanged", err)
	}
	if got := v.confirmLimit(); got != before {
		t.Fatalf("a failed continuity check moved the limit from %s to %s", before, got)
	}
}

// TestVerificationContinues: which differences between two observations of the outbox mean that rows
// may have gone unpublished in between.
func TestVerificationContinues(t *testing.T) {
	o := replication.Outbox{Schema: "public", Table: "outbox", Publication: "pub"}
	base := replication.Verification{LSN: 1, TableOID: 10, PublicationOID: 20, Membership: []string{"schema:40", "table:30"}}
	tests := []struct {
		name   string
		change func(v *replication.Verification)
		broken bool
	}{
		{"same", func(*replication.Verification) {}, false},
		{"a membership row added", func(v *replication.Verification) { v.Membership = []string{"schema:40", "table:30", "table:31"} }, false},
		{"one of two membership rows removed", func(v *replication.Verification) { v.Membership = []string{"schema:40"} }, false},
		{"removed and added back", func(v *replication.Verification) { v.Membership = []string{"table:31"} }, true},
		{"table re-created", func(v *replication.Verification) { v.TableOID = 11 }, true},
		{"publication re-created", func(v *replication.Verification) { v.PublicationOID = 21 }, true},
	}
	for _, tt := range tests {
		v := base
		v.Membership = append([]string(nil), base.Membership...)
		tt.change(&v)
		err := v.Continues(base, o)
		if got := errors.Is(err, replication.ErrOutboxChanged); got != tt.broken {
			t.Errorf("%s: Continues = %v, want broken %t", tt.name, err, tt.broken)
		}
	}
	if err := base.Continues(replication.Verification{}, o); err != nil {
		t.Errorf("a first observation has nothing to continue: %v", err)
	}
}

// TestAcceptGapAcceptsOnlyTheGapItWasGivenFor: --accept-gap answers the gap the first checkpoint read
// finds, and that same gap in a later session (the slot and the checkpoint unmoved); any other gap —
// the slot moved further, a new checkpoint, or a gap that opens after a first read without one — is
// refused.
func TestAcceptGapAcceptsOnlyTheGapItWasGivenFor(t *testing.T) {
	written := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	cp := &checkpoint.Record{LSN: 0x1000, Written: written}
	later := &checkpoint.Record{LSN: 0x3000, Written: written.Add(time.Minute)}
	type read struct {
		slot checkpoint.LSN
		last *checkpoint.Record
		ok   bool
	}
	tests := []struct {
		name  string
		flag  bool
		reads []read
	}{
		{"no flag", false, []read{{0x2000, cp, false}}},
		{"the gap, again and again", true, []read{{0x2000, cp, true}, {0x2000, cp, true}, {0x1800, cp, true}}},
		{"the slot moved on", true, []read{{0x2000, cp, true}, {0x2800, cp, false}}},
		{"a new checkpoint, then a gap", true, []read{{0x2000, cp, true}, {0x3000, later, true}, {0x4000, later, false}}},
		{"no gap first", true, []read{{0x1000, cp, true}, {0x2000, cp, false}}},
		{"no checkpoint first", true, []read{{0x1000, nil, true}, {0x2000, cp, false}}},
	}
	for _, tt := range tests {
		g := gapPolicy{flag: tt.flag}
		for i, r := range tt.reads {
			_, err := g.start(r.slot, checkpoint.Server{}, r.last)
			if (err == nil) != r.ok || (err != nil && !errors.Is(err, checkpoint.ErrGap)) {
				t.Errorf("%s: read %d (slot %s, checkpoint %v): %v, want accepted %t", tt.name, i+1, r.slot, r.last, err, r.ok)
			}
		}
	}
}
