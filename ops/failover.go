package ops

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// FailoverReport says whether the slot survives a failover of the primary: the primary's side
// (synchronized_standby_slots) and each standby given with --standby.
type FailoverReport struct {
	Primary  replication.PrimaryFailover `json:"primary"`
	Standbys []StandbyReport             `json:"standbys,omitempty"`
}

// StandbyReport is one standby's readiness to take over the slot.
type StandbyReport struct {
	// Target is user@host:port/database; Reachable says whether it answered (else Error).
	Target    string                      `json:"target"`
	Reachable bool                        `json:"reachable"`
	Error     string                      `json:"error,omitempty"`
	Facts     replication.StandbyFailover `json:"facts"`
	// TrailBytes is how far the standby's copy of the slot trails the primary's confirmed position.
	TrailBytes int64 `json:"trail_bytes"`
	// Ready is true when Problems is empty.
	Ready    bool     `json:"ready"`
	Problems []string `json:"problems"`
}

// gatherFailover reads the primary's failover facts on cat and each standby's (reached with the
// primary's password command, if any).
func gatherFailover(ctx context.Context, cat *replication.Catalog, slot string, primary replication.Target, standbys []string) (*FailoverReport, error) {
	facts, err := cat.PrimaryFailover(ctx)
	if err != nil {
		return nil, err
	}
	rep := &FailoverReport{Primary: facts}
	for _, url := range standbys {
		sr := StandbyReport{Target: config.Target(url, "postgres.standby_urls")}
		sc, err := replication.OpenCatalog(ctx, primary.At(url))
		if err != nil {
			sr.Error = err.Error()
			rep.Standbys = append(rep.Standbys, sr)
			continue
		}
		sr.Reachable = true
		sr.Facts, err = sc.StandbyFailover(ctx, slot)
		_ = sc.Close(context.Background())
		if err != nil {
			sr.Error = err.Error()
		}
		rep.Standbys = append(rep.Standbys, sr)
	}
	return rep, nil
}

// evaluateFailover adds the failover problems (status exits 1) and warnings of the report.
func (st *Status) evaluateFailover() (problems, warnings []string) {
	f := st.Failover
	if f == nil {
		return nil, nil
	}
	p := f.Primary
	if len(p.MissingStandbySlots) > 0 {
		problems = append(problems, fmt.Sprintf("synchronized_standby_slots names %s, which this server has no physical slot for: logical decoding of failover slots waits for them forever (only a server WARNING says so). A standby copied from a primary, then promoted, inherits the setting: set it to this server's standbys' slots, or empty",
			strings.Join(p.MissingStandbySlots, ", ")))
	}
	if st.Slot.Exists && st.Slot.Failover && len(p.SynchronizedStandbySlots) == 0 {
		warnings = append(warnings, fmt.Sprintf("slot %s is a failover slot but synchronized_standby_slots is empty: the router may publish a transaction a standby has not received yet, and after a failover to that standby the event is in Kafka while its row is not in the database (a phantom event); set synchronized_standby_slots to the standbys' physical slots", st.Slot.Name))
	}
	if !p.FailoverSupported() && p.ServerVersion > 0 && len(f.Standbys) > 0 {
		problems = append(problems, fmt.Sprintf("PostgreSQL %d has no failover slots (17 and later do): after a failover the slot does not exist on the new primary, and what was written between the router's last position and the failover is in no slot there: recover with outbox-cdc resync", p.ServerVersion/10000))
	}
	for i := range f.Standbys {
		sb := &f.Standbys[i]
		sb.Problems = standbyProblems(*sb, st.Slot, p)
		sb.Ready = len(sb.Problems) == 0
		for _, pr := range sb.Problems {
			problems = append(problems, "standby "+sb.Target+": "+pr)
		}
	}
	return problems, warnings
}

// standbyProblems says what keeps a standby from taking over the slot at a failover.
func standbyProblems(sb StandbyReport, slot replication.SlotState, p replication.PrimaryFailover) []string {
	if !sb.Reachable || sb.Error != "" {
		return []string{"unreachable: " + sb.Error}
	}
	s := sb.Facts
	var out []string
	if !s.InRecovery {
		return []string{"not a standby (pg_is_in_recovery() is false)"}
	}
	if s.ServerVersion < 170000 {
		return []string{fmt.Sprintf("PostgreSQL %d has no failover slots: a promotion loses the slot", s.ServerVersion/10000)}
	}
	if !s.SyncReplicationSlots {
		out = append(out, "sync_replication_slots is off: the slot is not copied to it")
	}
	if !s.HotStandbyFeedback {
		out = append(out, "hot_standby_feedback is off: slot synchronization needs it")
	}
	switch {
	case s.PrimarySlotName == "":
		out = append(out, "primary_slot_name is empty: slot synchronization needs a physical slot on the primary")
	default:
		if _, ok := p.PhysicalSlots[s.PrimarySlotName]; !ok {
			out = append(out, fmt.Sprintf("primary_slot_name %s has no physical slot on the primary", s.PrimarySlotName))
		}
		if !slices.Contains(p.SynchronizedStandbySlots, s.PrimarySlotName) && !slices.Contains(p.SynchronizedStandbySlots, "*") {
			out = append(out, fmt.Sprintf("the primary's synchronized_standby_slots does not name %s: the router may publish what this standby has not received, and a failover to it then leaves phantom events in Kafka", s.PrimarySlotName))
		}
	}
	if !s.PrimaryConninfoHasDatabase {
		out = append(out, "primary_conninfo names no dbname: slot synchronization needs one")
	}
	switch {
	case !slot.Exists:
	case !slot.Failover:
		out = append(out, fmt.Sprintf("slot %s is not a failover slot on the primary (postgres.failover_slot)", slot.Name))
	case !s.SlotExists:
		out = append(out, fmt.Sprintf("slot %s has not been synchronized to it yet", slot.Name))
	case s.SlotInvalidation != "":
		out = append(out, fmt.Sprintf("its copy of slot %s is invalidated (%s)", slot.Name, s.SlotInvalidation))
	case !s.SlotSynced:
		out = append(out, fmt.Sprintf("its slot %s is not a synced copy of the primary's", slot.Name))
	case s.SlotTemporary:
		out = append(out, fmt.Sprintf("its copy of slot %s is still temporary (a promotion drops it) until the router has moved the slot forward on the primary", slot.Name))
	}
	return out
}

// reportFailover prints, for init, whether the slot will survive a failover: the primary's traps and
// each standby of postgres.standby_urls. A standby that is not ready yet is explained, not an error:
// right after the slot is created its copy on a standby is still temporary.
func reportFailover(ctx context.Context, w io.Writer, cat *replication.Catalog, cfg config.Config) error {
	rep, err := gatherFailover(ctx, cat, cfg.Postgres.Slot, replication.TargetOf(cfg.Postgres), cfg.Postgres.StandbyURLs)
	if err != nil {
		return err
	}
	slot, err := cat.Slot(ctx, cfg.Postgres.Slot)
	if err != nil {
		return err
	}
	rep.trail(slot)
	st := Status{Slot: slot, Failover: rep}
	problems, warnings := st.evaluateFailover()
	for _, p := range problems {
		fmt.Fprintf(w, "FIX  failover: %s\n", p)
	}
	for _, wa := range warnings {
		fmt.Fprintf(w, "WARN failover: %s\n", wa)
	}
	for _, sb := range rep.Standbys {
		if sb.Ready {
			fmt.Fprintf(w, "ok   standby %s is ready to take over slot %s (its copy trails %d bytes)\n", sb.Target, slot.Name, sb.TrailBytes)
		}
	}
	switch {
	case !rep.Primary.FailoverSupported() && len(rep.Standbys) == 0:
		fmt.Fprintf(w, "note PostgreSQL %d has no failover slots: after a failover, run outbox-cdc resync\n", rep.Primary.ServerVersion/10000)
	case len(rep.Standbys) == 0 && len(problems)+len(warnings) == 0 && slot.Failover:
		fmt.Fprintf(w, "ok   slot %s is a failover slot; give --standby URL to check a standby's readiness\n", slot.Name)
	}
	return nil
}

// trail sets each standby's trail behind the primary's slot.
func (f *FailoverReport) trail(primary replication.SlotState) {
	for i := range f.Standbys {
		sb := &f.Standbys[i]
		if sb.Facts.SlotExists && primary.ConfirmedFlush > sb.Facts.SlotConfirmedFlush {
			sb.TrailBytes = int64(primary.ConfirmedFlush - sb.Facts.SlotConfirmedFlush)
		}
	}
}
