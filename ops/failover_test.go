package ops

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestFailoverReadiness: a standby configured as PostgreSQL 17 asks is ready; each missing piece is
// named, and the primary's own traps (a synchronized_standby_slots name without its slot, a failover
// slot without synchronized_standby_slots) are caught.
func TestFailoverReadiness(t *testing.T) {
	slot := replication.SlotState{Name: "outbox_cdc", Exists: true, Failover: true, ConfirmedFlush: 5000}
	primary := replication.PrimaryFailover{ServerVersion: 170010, SynchronizedStandbySlots: []string{"sb1"},
		PhysicalSlots: map[string]replication.LSN{"sb1": 6000}}
	ready := StandbyReport{Target: "u@standby:5432/outbox", Reachable: true, Facts: replication.StandbyFailover{
		ServerVersion: 170010, InRecovery: true, SyncReplicationSlots: true, HotStandbyFeedback: true,
		PrimarySlotName: "sb1", PrimaryConninfoHasDatabase: true,
		SlotExists: true, SlotSynced: true, SlotConfirmedFlush: 4000}}
	tests := []struct {
		name        string
		mutate      func(*Status)
		wantProblem string // "" : healthy
		wantWarning string
	}{
		{"ready", func(*Status) {}, "", ""},
		{"not in recovery", func(s *Status) { s.Failover.Standbys[0].Facts.InRecovery = false }, "not a standby", ""},
		{"sync off", func(s *Status) { s.Failover.Standbys[0].Facts.SyncReplicationSlots = false }, "sync_replication_slots is off", ""},
		{"no feedback", func(s *Status) { s.Failover.Standbys[0].Facts.HotStandbyFeedback = false }, "hot_standby_feedback is off", ""},
		{"no primary slot name", func(s *Status) { s.Failover.Standbys[0].Facts.PrimarySlotName = "" }, "primary_slot_name is empty", ""},
		{"primary slot missing", func(s *Status) { s.Failover.Standbys[0].Facts.PrimarySlotName = "sb2" }, "primary_slot_name sb2 has no physical slot", ""},
		{"not synchronized", func(s *Status) { s.Failover.Primary.SynchronizedStandbySlots = nil },
			"synchronized_standby_slots does not name sb1", "phantom event"},
		{"no dbname", func(s *Status) { s.Failover.Standbys[0].Facts.PrimaryConninfoHasDatabase = false }, "names no dbname", ""},
		{"slot not synced yet", func(s *Status) { s.Failover.Standbys[0].Facts.SlotExists = false }, "has not been synchronized", ""},
		{"slot temporary", func(s *Status) { s.Failover.Standbys[0].Facts.SlotTemporary = true }, "still temporary", ""},
		{"slot invalidated", func(s *Status) { s.Failover.Standbys[0].Facts.SlotInvalidation = "rows_removed" }, "invalidated (rows_removed)", ""},
		{"slot not failover", func(s *Status) { s.Slot.Failover = false }, "not a failover slot", ""},
		{"unreachable", func(s *Status) { s.Failover.Standbys[0] = StandbyReport{Target: "x", Error: "connection refused"} }, "unreachable: connection refused", ""},
		{"standby 16", func(s *Status) { s.Failover.Standbys[0].Facts.ServerVersion = 160004 }, "PostgreSQL 16 has no failover slots", ""},
		{"primary 16", func(s *Status) { s.Failover.Primary.ServerVersion = 160004 }, "PostgreSQL 16 has no failover slots (17 and later do)", ""},
		{"synchronized_standby_slots names a missing slot", func(s *Status) {
			s.Failover.Standbys = nil
			s.Failover.Primary.SynchronizedStandbySlots = []string{"gone"}
			s.Failover.Primary.MissingStandbySlots = []string{"gone"}
		}, "waits for them forever", ""},
		{"no standby given, failover slot unprotected", func(s *Status) {
			s.Failover.Standbys = nil
			s.Failover.Primary.SynchronizedStandbySlots = nil
		}, "", "synchronized_standby_slots is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := ready
			st := Status{Postgres: PostgresReport{Reachable: true}, Slot: slot, Publication: replication.PublicationState{Exists: true},
				Kafka: KafkaReport{Reachable: true}, Failover: &FailoverReport{Primary: primary, Standbys: []StandbyReport{sb}}}
			st.Failover.Primary.SynchronizedStandbySlots = append([]string(nil), primary.SynchronizedStandbySlots...)
			tt.mutate(&st)
			st.Evaluate(Thresholds{MaxLagBytes: 1 << 30})
			if tt.wantProblem == "" {
				if !st.Healthy {
					t.Fatalf("unhealthy: %v", st.Problems)
				}
			} else if st.Healthy || !strings.Contains(strings.Join(st.Problems, "\n"), tt.wantProblem) {
				t.Fatalf("problems %q, want one saying %q", st.Problems, tt.wantProblem)
			}
			if tt.wantWarning != "" && !strings.Contains(strings.Join(st.Warnings, "\n"), tt.wantWarning) {
				t.Fatalf("warnings %q, want one saying %q", st.Warnings, tt.wantWarning)
			}
			if len(st.Failover.Standbys) > 0 && st.Failover.Standbys[0].Ready != (tt.wantProblem == "") && tt.name != "primary 16" {
				t.Fatalf("standby ready = %t with problems %q", st.Failover.Standbys[0].Ready, st.Problems)
			}
		})
	}
	f := &FailoverReport{Standbys: []StandbyReport{ready}}
	f.trail(slot)
	if f.Standbys[0].TrailBytes != 1000 {
		t.Fatalf("trail %d bytes, want 1000", f.Standbys[0].TrailBytes)
	}
}

func TestConninfoHasDatabase(t *testing.T) {
	for _, tt := range []struct {
		conninfo string
		want     bool
	}{
		{"host=p port=5432 user=rep dbname=outbox", true},
		{"host=p port=5432 user=rep", false},
		{"postgres://rep@p:5432/outbox", true},
		{"postgres://rep@p:5432", false},
		{"postgresql://rep@p:5432/?dbname=outbox", true},
	} {
		if got := replication.ConninfoHasDatabase(tt.conninfo); got != tt.want {
			t.Errorf("%q: has dbname %t, want %t", tt.conninfo, got, tt.want)
		}
	}
}
