package main

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestDuplicatesByFault: a duplicate is put down to the fault under way at its event's commit (a
// broker stopping writes what it is sent and loses the acknowledgements), else to the next fault;
// with no fault ending after the commit it is needless ("none").
func TestDuplicatesByFault(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 4, 18, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	faults := []faultAt{
		{kind: "kafka", at: at(10), end: at(20)},
		{kind: "term", at: at(30), end: at(31)},
		{kind: "kill", at: at(40), end: at(41)},
	}
	events := []testenv.Event{{ID: "before-kafka"}, {ID: "during-kafka"}, {ID: "between"}, {ID: "after-all"}, {ID: "once"}}
	commits := []time.Time{at(5), at(15), at(35), at(50), at(36)}
	var got []*kgo.Record
	for _, e := range events {
		copies := 2
		if e.ID == "once" {
			copies = 1
		}
		for range copies {
			got = append(got, &kgo.Record{Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(e.ID)}}})
		}
	}
	want := "duplicates by fault: kill:1 (1 per fault), term:0 (0 per fault), kafka:2 (2 per fault), none:1"
	if s := duplicatesByFault(got, [][]testenv.Event{events}, [][]time.Time{commits}, faults, []string{"kill", "term", "kafka"}); s != want {
		t.Errorf("got  %s\nwant %s", s, want)
	}
	// A fault still under way (no end) takes what was committed during it.
	faults = append(faults, faultAt{kind: "kill", at: at(45)})
	want = "duplicates by fault: kill:2 (1 per fault), term:0 (0 per fault), kafka:2 (2 per fault)"
	if s := duplicatesByFault(got, [][]testenv.Event{events}, [][]time.Time{commits}, faults, []string{"kill", "term", "kafka"}); s != want {
		t.Errorf("got  %s\nwant %s", s, want)
	}
}
