package pipeline

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestNewTopicsDoNotStallTheStream writes a steady stream to one topic and, within a fraction of a
// second, the first rows of eight new topics: created by the router, or by someone else a moment
// before (their leaders may not serve them yet). The steady topic's records must keep flowing — in
// at-least-once mode none may wait behind the new topics' creation, in exactly-once mode at most one
// creation (the Kafka transaction holds the new topics' records) — and the new topics' own first
// records must arrive within a second or two, not after franz-go's 5 s metadata minimum age.
func TestNewTopicsDoNotStallTheStream(t *testing.T) {
	for _, precreate := range []bool{false, true} {
		name := "created by the router"
		if precreate {
			name = "created by someone else"
		}
		t.Run(name, func(t *testing.T) {
			forEachDelivery(t, func(t *testing.T, mode deliveryMode) { testNewTopicsDoNotStallTheStream(t, mode, precreate) })
		})
	}
}

func testNewTopicsDoNotStallTheStream(t *testing.T, mode deliveryMode, precreate bool) {
	f := testenv.NewFixture(t)
	cfg := mode.config(f)
	startPipeline(t, cfg)
	ctx := context.Background()
	steady := testenv.NewGenerator(4, "Steady")
	// The steady topic exists before the measurement starts.
	if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{steady.Event(0)}, false); err != nil {
		t.Fatal(err)
	}
	testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Steady"), 1, 30*time.Second, mode.consumer...)

	newTypes := []string{"NewA", "NewB", "NewC", "NewD", "NewE", "NewF", "NewG", "NewH"}
	var mu sync.Mutex
	committed := map[string]time.Time{} // event id -> commit returned
	arrived := map[string]time.Time{}
	isNew := map[string]bool{}
	stop := make(chan struct{})
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		topics := testenv.TopicsOf(f, append([]string{"Steady"}, newTypes...)...)
		seen := 0
		testenv.ConsumeUntil(t, f.Brokers, topics, func(recs []*kgo.Record) bool {
			now := time.Now()
			mu.Lock()
			for _, r := range recs[seen:] {
				if id := testenv.EventID(r); arrived[id].IsZero() {
					arrived[id] = now
				}
			}
			mu.Unlock()
			seen = len(recs)
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}, 2*time.Minute, append(slices.Clone(mode.consumer),
			kgo.FetchMaxWait(20*time.Millisecond), kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(100*time.Millisecond))...)
	}()
	time.Sleep(time.Second) // the consumer joins
	write := func(e testenv.Event, fresh bool) {
		if err := testenv.InsertTx(ctx, f.DB, f.Table, []testenv.Event{e}, false); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		committed[e.ID] = time.Now()
		isNew[e.ID] = fresh
		mu.Unlock()
	}
	fresh := testenv.NewGenerator(len(newTypes), newTypes...).WithPrefix("fresh-")
	start := time.Now()
	for i, burst := 0, 0; time.Since(start) < 6*time.Second; i++ {
		write(steady.Event(i), false)
		if time.Since(start) > time.Second && burst < len(newTypes) {
			if burst == 0 && precreate {
				cl, err := kgo.NewClient(kgo.SeedBrokers(f.Brokers...))
				if err != nil {
					t.Fatal(err)
				}
				_, err = kadm.NewClient(cl).CreateTopics(ctx, 3, 1, nil, testenv.TopicsOf(f, newTypes...)...)
				cl.Close()
				if err != nil {
					t.Fatal(err)
				}
			}
			write(fresh.Event(burst), true)
			burst++
		}
		time.Sleep(10 * time.Millisecond)
	}
	testenv.WaitFor(t, 60*time.Second, "every event consumed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range committed {
			if arrived[id].IsZero() {
				return false
			}
		}
		return true
	})
	close(stop)
	<-consumed
	var worstSteady, worstNew time.Duration
	news := 0
	for id, c := range committed {
		lat := arrived[id].Sub(c)
		if isNew[id] {
			news++
			worstNew = max(worstNew, lat)
		} else {
			worstSteady = max(worstSteady, lat)
		}
	}
	t.Logf("%d steady and %d new-topic events: worst latency %s steady, %s new topics", len(committed)-news, news,
		worstSteady.Round(time.Millisecond), worstNew.Round(time.Millisecond))
	if news != len(newTypes) {
		t.Fatalf("%d events for new topics were written, want %d", news, len(newTypes))
	}
	// Creating one topic takes 0.2-0.5 s here; eight one after the other, or a metadata wait, take
	// seconds.
	steadyLimit, newLimit := time.Second, 3*time.Second
	if mode.name == config.DeliveryExactlyOnce {
		steadyLimit = 2 * time.Second
	}
	if worstSteady > steadyLimit {
		t.Errorf("records of an existing topic waited %s behind new topics (limit %s)", worstSteady.Round(time.Millisecond), steadyLimit)
	}
	if worstNew > newLimit {
		t.Errorf("the first records of new topics waited %s (limit %s)", worstNew.Round(time.Millisecond), newLimit)
	}
}
