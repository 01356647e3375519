package fleet_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/fleet"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// recorder records a coordinator's events in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Assigned(name string, assigned bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("assigned %s %t", name, assigned))
}

func (r *recorder) Paused(name string, p fleet.Pause) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("paused %s %t", name, p.Paused))
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func coordinator(t *testing.T, group string) *fleet.Coordinator {
	return &fleet.Coordinator{
		Group: group, Topic: "outbox-cdc.fleet." + group, Instance: t.Name(), SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 30 * time.Second, ReplicationFactor: -1, ClientOpts: []kgo.Opt{kgo.SeedBrokers(testenv.Brokers(t)...)}, Log: testLogger(),
	}
}

// TestPauseIsKnownBeforeAssignment: an instance that joins a fleet where a source is paused learns the
// pause before it is assigned the source, so it never starts it, not even for a moment.
func TestPauseIsKnownBeforeAssignment(t *testing.T) {
	testenv.Brokers(t) // fails with how to start Kafka when it is not there (skips only under -short)
	group := fmt.Sprintf("test-pause-%04x", rand.IntN(0xffff))
	names := []string{"a", "b", "c"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A first instance pauses b and leaves.
	first := coordinator(t, group)
	rec := &recorder{}
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx, names, rec) }()
	testenv.WaitFor(t, 60*time.Second, "the first instance assigned every source", func() bool {
		return len(rec.snapshot()) >= 3
	})
	if err := first.SetPause(ctx, "b", fleet.Pause{Paused: true, By: "test"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the first instance seeing the pause", func() bool {
		for _, e := range rec.snapshot() {
			if e == "paused b true" {
				return true
			}
		}
		return false
	})
	cancel()
	<-done

	// A second instance joins: the pause of b comes before b is assigned.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	rec2 := &recorder{}
	go func() { _ = coordinator(t, group).Run(ctx2, names, rec2) }()
	testenv.WaitFor(t, 60*time.Second, "the second instance assigned b", func() bool {
		for _, e := range rec2.snapshot() {
			if e == "assigned b true" {
				return true
			}
		}
		return false
	})
	events := rec2.snapshot()
	for _, e := range events {
		if e == "paused b true" {
			return
		}
		if e == "assigned b true" {
			t.Fatalf("b was assigned before its pause was known: %v", events)
		}
	}
}
