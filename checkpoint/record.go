package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SlotID names one replication slot of one database cluster: the key of its checkpoint records.
// A cluster restored from a copy keeps its system identifier; one initialized anew gets another.
type SlotID struct {
	// SystemID is the cluster's system identifier (IDENTIFY_SYSTEM).
	SystemID string `json:"system_id"`
	// Database is the database the slot belongs to.
	Database string `json:"database"`
	// Slot is the replication slot's name.
	Slot string `json:"slot"`
}

// String is the checkpoint record's key: system id, database and slot, joined by '/'.
func (s SlotID) String() string {
	return s.SystemID + "/" + s.Database + "/" + s.Slot
}

// TransactionalID is the Kafka transactional id every instance streaming this slot shares, so that
// the one that takes the slot fences any older one.
func (s SlotID) TransactionalID() string {
	return "outbox-cdc-" + s.String()
}

// Record is the checkpoint written in every Kafka transaction of the exactly-once mode: everything the
// slot streamed before LSN is in Kafka, in committed transactions.
type Record struct {
	// Slot identifies the slot whose position this is.
	Slot SlotID `json:"slot"`
	// LSN is the end position of the last PostgreSQL transaction the Kafka transaction holds (or a
	// position the stream reached with nothing in flight): every transaction whose commit record
	// begins before it is in Kafka.
	LSN LSN `json:"lsn"`
	// Timeline is the timeline of the server the slot streamed from when the record was written (zero
	// in records of versions that did not write it). After a failover it tells how far the new
	// primary's WAL is the same as the one the checkpoint counted in.
	Timeline uint32 `json:"timeline,omitempty"`
	// TimelineStart is where that timeline began on the server (the end of its parent in the
	// timeline history; zero on timeline 1, and in records of versions that did not write it). Two
	// standbys promoted independently can both pick the same timeline number; their start points
	// tell them apart.
	TimelineStart LSN `json:"timeline_start,omitempty"`
	// Transactions and Records count what the Kafka transaction holds (informational).
	Transactions int `json:"transactions"`
	Records      int `json:"records"`
	// Written is when the record was written.
	Written time.Time `json:"written"`
	// Delivery is "at-least-once" in a hand-over record: an at-least-once router of the slot wrote
	// it at its graceful stop, at the position it confirmed, every transaction before it
	// acknowledged by Kafka (at least once), so that the exactly-once mode resumes there without a
	// gap. Empty in the records of Kafka transactions.
	Delivery string `json:"delivery,omitempty"`
}

// Marshal encodes the record as its checkpoint-topic value.
func (r Record) Marshal() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("checkpoint: marshal record: %v", err)) // a struct of strings, numbers and a time
	}
	return b
}

// ParseRecord decodes a checkpoint-topic value, checking that it names the slot it is keyed by.
func ParseRecord(key, value []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(value, &r); err != nil {
		return r, fmt.Errorf("parse checkpoint record %q: %w", key, err)
	}
	if r.Slot.String() != string(key) {
		return r, fmt.Errorf("checkpoint record keyed %q names slot %q", key, r.Slot.String())
	}
	if r.LSN == 0 {
		return r, fmt.Errorf("checkpoint record %q has no position", key)
	}
	return r, nil
}

// AlreadyDelivered reports whether a transaction whose commit record begins at commitLSN (the Begin
// message's FinalLSN) is held by the Kafka transaction that wrote checkpoint: it committed before the
// checkpoint's end position. It is PostgreSQL's own rule for a slot confirmed at that position (a
// transaction is skipped when its commit record begins before the start point), applied by whole
// transaction; row positions play no part.
func AlreadyDelivered(commitLSN, checkpoint LSN) bool {
	return commitLSN < checkpoint
}

// ErrGap is returned (wrapped) when the slot stands ahead of the last checkpoint: it was dropped and
// created anew, advanced by hand, or used by another tool, and what lies between the two positions
// may never have reached Kafka.
var ErrGap = errors.New("the replication slot is ahead of the last checkpoint in Kafka")

// ErrBeyondWAL is returned (wrapped) when the last checkpoint counts transactions past the end of the
// server's WAL: no router of this slot wrote it on this server. Trusting it would skip every
// transaction up to its position.
var ErrBeyondWAL = errors.New("the last checkpoint in Kafka stands past the end of the server's WAL")

// ErrMissing is returned (wrapped) when a slot that had a checkpoint in Kafka finds none: the
// checkpoint topic was deleted, or its records expired. Resuming from the slot would deliver the
// unconfirmed tail again to read_committed consumers.
var ErrMissing = errors.New("the slot's checkpoint is missing from Kafka")

// TimelineEnd is one line of a server's timeline history: Timeline ended at End, where the server's
// WAL continued on the next timeline (a promotion, or a recovery to a point in time).
type TimelineEnd struct {
	Timeline uint32
	End      LSN
}

// ParseTimelineHistory parses a timeline history file (what TIMELINE_HISTORY returns): one line per
// earlier timeline, "timeline<TAB>end LSN<TAB>reason"; blank lines and comments are skipped.
func ParseTimelineHistory(content []byte) ([]TimelineEnd, error) {
	var out []TimelineEnd
	for i, line := range strings.Split(string(content), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("timeline history line %d: %q has no end position", i+1, line)
		}
		tl, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("timeline history line %d: timeline %q: %w", i+1, fields[0], err)
		}
		var end LSN
		if err := end.UnmarshalText([]byte(fields[1])); err != nil {
			return nil, fmt.Errorf("timeline history line %d: %w", i+1, err)
		}
		out = append(out, TimelineEnd{Timeline: uint32(tl), End: end})
	}
	return out, nil
}

// Server is what the exactly-once mode knows of the server it resumes on: its current timeline and
// that timeline's history (empty on timeline 1).
type Server struct {
	Timeline uint32
	History  []TimelineEnd
	// WALEnd is how far the server's WAL reaches (IDENTIFY_SYSTEM's xlogpos); zero when unknown. A
	// checkpoint that counts past it was not written by this slot's router on this server.
	WALEnd LSN
}

// TimelineStart returns where timeline tl began in this server's history (the end of the timeline
// before it; zero for the first), and false when tl is neither the current timeline nor in its
// history.
func (s Server) TimelineStart(tl uint32) (LSN, bool) {
	start := LSN(0)
	for _, h := range s.History {
		if h.Timeline == tl {
			return start, true
		}
		start = h.End
	}
	return start, tl == s.Timeline
}

// timelineEnd returns where timeline tl ended in this server's history, and false when it did not
// end there (it is the current timeline, or not in the history).
func (s Server) timelineEnd(tl uint32) (LSN, bool) {
	for _, h := range s.History {
		if h.Timeline == tl {
			return h.End, true
		}
	}
	return 0, false
}

// Resume is where the exactly-once mode resumes.
type Resume struct {
	// SkipBelow is the position below which transactions are already in Kafka (zero: none are).
	SkipBelow LSN
	// PhantomFrom and PhantomTo are set when the checkpoint was written on a timeline that ended on
	// this server before the checkpoint's position: the old primary's WAL between them never reached
	// this server, so Kafka holds events from there whose rows do not exist here (phantom events),
	// and the positions from PhantomFrom on are this timeline's new transactions.
	PhantomFrom, PhantomTo LSN
	// Unrelated is set when the checkpoint's timeline is not in this server's history (a server
	// restored from a backup, or one that is on an older timeline than the checkpoint): its position
	// means nothing here, so nothing is skipped beyond the slot's own position.
	Unrelated bool
}

// Start decides where the exactly-once mode resumes. slot is the slot's confirmed position; server is
// the server's timeline and history; last is the last committed checkpoint, or nil when none was ever
// written. A checkpoint written on an earlier timeline counts only up to where that timeline ended on
// this server: past that point the same positions hold other transactions, which must not be taken
// for delivered. It returns an error wrapping ErrGap when the slot is ahead of where the mode would
// resume and acceptGap is false.
func Start(slot LSN, server Server, last *Record, acceptGap bool) (Resume, error) {
	if last == nil {
		return Resume{}, nil
	}
	r := Resume{SkipBelow: last.LSN}
	if last.Timeline != 0 && server.Timeline != 0 {
		// How far this server's WAL is the one the checkpoint counted in: to where the checkpoint's
		// timeline ended here, if it did; and, if this server's timeline of that number began
		// elsewhere (a sibling promoted independently), only to where the two branched.
		shared, ok := server.timelineEnd(last.Timeline)
		if !ok {
			shared = last.LSN
		}
		start, known := server.TimelineStart(last.Timeline)
		if !known {
			return Resume{SkipBelow: slot, Unrelated: true}, nil
		}
		if last.TimelineStart != 0 && start != last.TimelineStart {
			shared = min(shared, start, last.TimelineStart)
		}
		if shared < last.LSN {
			r = Resume{SkipBelow: shared, PhantomFrom: shared, PhantomTo: last.LSN}
		}
	}
	if server.WALEnd != 0 && r.SkipBelow > server.WALEnd {
		return Resume{}, fmt.Errorf("%w: the checkpoint (%s, written %s) would have every transaction up to there skipped as delivered, but the server's WAL ends at %s: "+
			"no router of this slot wrote it on this server (a record put in kafka.checkpoint_topic by something else, or a server restored to an earlier point under the same system identifier). "+
			"Recover with `outbox-cdc resync`: it republishes the rows still in the outbox and writes a checkpoint of its own, which replaces this one",
			ErrBeyondWAL, last.LSN, last.Written.UTC().Format(time.RFC3339), server.WALEnd)
	}
	if slot > r.SkipBelow && !acceptGap {
		return Resume{}, fmt.Errorf("%w: the slot is confirmed at %s but the last checkpoint is at %s (written %s): %s of WAL between them may hold events that never reached Kafka. "+
			"The slot was dropped and created anew (also by a failover to a server that lacked it), advanced by hand, used by another tool, "+
			"or streamed in at-least-once mode since without a graceful stop (an at-least-once router stopped with SIGTERM writes a hand-over checkpoint at the position it confirmed, so that the switch to exactly-once has no gap: start it once more and stop it so). "+
			"Recover rows still in the outbox with `outbox-cdc resync`, or start with --accept-gap to stream from the slot's position and accept the gap",
			ErrGap, slot, r.SkipBelow, last.Written.UTC().Format(time.RFC3339), bytesString(uint64(slot-r.SkipBelow)))
	}
	return r, nil
}

func bytesString(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + " bytes"
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
