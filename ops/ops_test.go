package ops

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

func TestCheckPrerequisites(t *testing.T) {
	good := replication.Prerequisites{WALLevel: "logical", MaxSlots: 10, Slots: 2, MaxSenders: 10, Senders: 1, Replication: true, TableExists: true, CanSelect: true}
	tests := []struct {
		name    string
		mutate  func(*replication.Prerequisites)
		wantFix string
	}{
		{"wal_level replica", func(f *replication.Prerequisites) { f.WALLevel = "replica" }, "ALTER SYSTEM SET wal_level = logical"},
		{"no slot left", func(f *replication.Prerequisites) { f.Slots = 10 }, "max_replication_slots"},
		{"no sender left", func(f *replication.Prerequisites) { f.Senders = 10 }, "max_wal_senders"},
		{"no replication attribute", func(f *replication.Prerequisites) { f.Replication = false }, "REPLICATION"},
		{"no select", func(f *replication.Prerequisites) { f.CanSelect = false }, "GRANT SELECT"},
	}
	if p := CheckPrerequisites(good); len(p) != 0 {
		t.Fatalf("a good server has problems: %v", p)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := good
			tt.mutate(&f)
			p := CheckPrerequisites(f)
			if len(p) != 1 || !strings.Contains(p[0].Fix, tt.wantFix) {
				t.Fatalf("problems %v, want one whose fix names %q", p, tt.wantFix)
			}
		})
	}
	// A managed service is told what to set its own way.
	for platform, want := range map[string][]string{
		replication.PlatformRDS:      {"rds.logical_replication = 1", "DB parameter group", "GRANT rds_replication"},
		replication.PlatformAurora:   {"rds.logical_replication = 1", "DB cluster parameter group", "GRANT rds_replication"},
		replication.PlatformCloudSQL: {"cloudsql.logical_decoding", "database flag", "cloudsqlsuperuser"},
		replication.PlatformAzure:    {"az postgres flexible-server parameter set", "server parameter", "azure_pg_admin"},
	} {
		f := good
		f.Platform, f.WALLevel, f.Senders, f.Replication = platform, "replica", 10, false
		p := CheckPrerequisites(f)
		var fixes []string
		for _, pr := range p {
			fixes = append(fixes, pr.Fix)
		}
		all := strings.Join(fixes, "\n")
		for _, w := range want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: fixes do not mention %q:\n%s", platform, w, all)
			}
		}
		if strings.Contains(all, "ALTER SYSTEM") {
			t.Errorf("%s: a managed service is told to ALTER SYSTEM, which it refuses:\n%s", platform, all)
		}
	}
	// A full server is fine when our slot already exists.
	f := good
	f.Slots, f.SlotExists = 10, true
	if p := CheckPrerequisites(f); len(p) != 0 {
		t.Fatalf("existing slot on a full server: %v", p)
	}
}

func TestEvaluateStatus(t *testing.T) {
	healthy := Status{Postgres: PostgresReport{Reachable: true}, Slot: replication.SlotState{Name: "s", Exists: true, Active: true, WALStatus: "reserved", LagBytes: 10},
		Publication: replication.PublicationState{Name: "p", Exists: true, PublishInsert: true}, Kafka: KafkaReport{Reachable: true}}
	evaluate := func(s Status, maxLag int64, maxInactive time.Duration) []string {
		s.Evaluate(Thresholds{MaxLagBytes: maxLag, MaxInactive: maxInactive})
		return s.Problems
	}
	if p := evaluate(healthy, 100, 0); len(p) != 0 {
		t.Fatalf("healthy status has problems: %v", p)
	}
	tests := []struct {
		name   string
		mutate func(*Status)
		want   string
	}{
		{"missing", func(s *Status) { s.Slot.Exists = false }, "does not exist"},
		{"lost", func(s *Status) { s.Slot.WALStatus = "lost" }, "resync"},
		{"invalidated idle (PostgreSQL 18)", func(s *Status) { s.Slot.InvalidationReason = "idle_timeout" }, "invalidated (idle_timeout)"},
		{"inactive, unknown since", func(s *Status) { s.Slot.Active = false; s.Slot.InactiveSeconds = -1 }, "inactive"},
		{"lag", func(s *Status) { s.Slot.LagBytes = 1000 }, "lags"},
		{"kafka", func(s *Status) { s.Kafka.Reachable = false; s.Kafka.Error = "dial" }, "kafka unreachable"},
		{"slot ahead of checkpoint", func(s *Status) {
			s.Slot.ConfirmedFlush = 0x2000
			s.Checkpoint = &CheckpointReport{Topic: "cp", Known: true, Found: true, LSN: 0x1000}
		}, "the last checkpoint is at 0/1000"},
		{"slot past where the checkpoint's timeline ended (a failover)", func(s *Status) {
			s.Slot.ConfirmedFlush = 0x4800
			s.Checkpoint = &CheckpointReport{Topic: "cp", Known: true, Found: true, LSN: 0x5000, Timeline: 1,
				Server: &checkpoint.Server{Timeline: 2, History: []checkpoint.TimelineEnd{{Timeline: 1, End: 0x4000}}}}
		}, "the last checkpoint is at 0/4000"},
		{"checkpoint unreadable", func(s *Status) { s.Checkpoint = &CheckpointReport{Topic: "cp", Error: "timeout"} }, "could not be read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := healthy
			tt.mutate(&s)
			p := evaluate(s, 100, 0)
			if len(p) == 0 || !strings.Contains(strings.Join(p, "\n"), tt.want) {
				t.Fatalf("problems %v, want one containing %q", p, tt.want)
			}
		})
	}
	// A database that did not answer: its slot and publication are unknown, not missing.
	down := Status{Postgres: PostgresReport{Error: "password authentication failed"}, Slot: replication.SlotState{Name: "s"},
		Publication: replication.PublicationState{Name: "p"}, Kafka: KafkaReport{Reachable: true}}
	if p := evaluate(down, 100, 0); len(p) != 1 || !strings.Contains(p[0], "unknown") || strings.Contains(p[0], "does not exist") {
		t.Fatalf("unreachable database reported as %v, want one problem saying the rest is unknown", p)
	}
	behind := healthy
	behind.Slot.ConfirmedFlush = 0x1000
	behind.Checkpoint = &CheckpointReport{Topic: "cp", Known: true, Found: true, LSN: 0x2000}
	if p := evaluate(behind, 100, 0); len(p) != 0 {
		t.Fatalf("a slot behind its checkpoint (the normal state after a crash) is unhealthy: %v", p)
	}
	recent := healthy
	recent.Slot.Active, recent.Slot.InactiveSeconds = false, 5
	if p := evaluate(recent, 100, 60_000_000_000); len(p) != 0 {
		t.Fatalf("a slot inactive for 5 s under a 1 min threshold is unhealthy: %v", p)
	}
}

// TestPrintSaysUnknownWhenTheDatabaseIsDown: the table never claims missing objects when
// PostgreSQL did not answer.
func TestPrintSaysUnknownWhenTheDatabaseIsDown(t *testing.T) {
	var b strings.Builder
	Status{Postgres: PostgresReport{Target: "u@h:5432/db"}, Slot: replication.SlotState{Name: "s"}, Publication: replication.PublicationState{Name: "p"},
		Outbox: replication.OutboxState{Table: "public.outbox"}}.Print(&b)
	if len(regexp.MustCompile(`exists\s+unknown`).FindAllString(b.String(), -1)) != 3 || regexp.MustCompile(`exists\s+no\n`).MatchString(b.String()) {
		t.Fatalf("status table:\n%s", b.String())
	}
	b.Reset()
	Status{Postgres: PostgresReport{Reachable: true}, Slot: replication.SlotState{Name: "s", Exists: true, Active: true, ActivePID: 7},
		Publication: replication.PublicationState{Name: "p"}, Healthy: true}.Print(&b)
	for _, want := range []string{`yes \(pid 7\)`, `exists\s+no\n`, `health\s+ok`} {
		if !regexp.MustCompile(want).MatchString(b.String()) {
			t.Errorf("status table lacks %q:\n%s", want, b.String())
		}
	}
}
