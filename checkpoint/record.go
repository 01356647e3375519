package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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
	// Transactions and Records count what the Kafka transaction holds (informational).
	Transactions int `json:"transactions"`
	Records      int `json:"records"`
	// Written is when the record was written.
	Written time.Time `json:"written"`
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

// Start decides where the exactly-once mode resumes. slot is the slot's confirmed position; last is
// the last committed checkpoint, or nil when none was ever written. It returns the position below
// which transactions are skipped as already delivered (zero when none is), or an error wrapping
// ErrGap when the slot is ahead of the checkpoint and acceptGap is false.
func Start(slot LSN, last *Record, acceptGap bool) (skipBelow LSN, err error) {
	if last == nil {
		return 0, nil
	}
	if slot > last.LSN && !acceptGap {
		return 0, fmt.Errorf("%w: the slot is confirmed at %s but the last checkpoint is at %s (written %s): %s of WAL between them may hold events that never reached Kafka. "+
			"The slot was dropped and created anew (also by a failover to a server that lacked it), advanced by hand, or used by another tool. Recover rows still in the outbox with `outbox-cdc resync`, "+
			"or start with --accept-gap to stream from the slot's position and accept the gap",
			ErrGap, slot, last.LSN, last.Written.UTC().Format(time.RFC3339), bytesString(uint64(slot-last.LSN)))
	}
	return last.LSN, nil
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
