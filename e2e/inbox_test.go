package e2e

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-cdc/outbox-cdc/examples/readmodel/readmodel"
	"github.com/outbox-cdc/outbox-cdc/inbox"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestReadModelIsExactUnderRouterKills: the example consuming service (examples/readmodel: a read
// model of orders that counts each event and sums its amount, through package inbox) runs while
// the at-least-once router is SIGKILLed again and again under load, so that Kafka holds duplicates.
// Two instances consume in one group: the second joins after the second kill, the first leaves
// after the fourth (rebalances mid-stream), and the handler fails the first attempt of every
// seventh event. At the end the read model equals exactly one application of every event committed
// to the outbox.
func TestReadModelIsExactUnderRouterKills(t *testing.T) {
	f := testenv.NewFixture(t)
	env := append(routerEnv(f), "OUTBOX_CDC_DELIVERY=at-least-once")
	types := []string{"OrderPlaced", "OrderPaid"}
	topics := testenv.TopicsOf(f, types...)
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, testenv.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	model := readmodel.Model{Table: f.Table + "_orders"}
	if err := model.Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	inboxTable := f.Table + "_inbox"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+f.Table+"_orders, "+inboxTable+", "+inboxTable+"_versions")
	})
	var mu sync.Mutex
	tries := map[string]int{}
	flaky := func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		mu.Lock()
		tries[ev.ID]++
		n := tries[ev.ID]
		mu.Unlock()
		h := fnv.New32a()
		_, _ = h.Write([]byte(ev.ID))
		if h.Sum32()%7 == 0 && n == 1 {
			return errors.New("injected: the first attempt of every seventh event fails")
		}
		return model.Apply(ctx, tx, ev)
	}
	consumer := func() (*inbox.Inbox, func()) {
		in, err := inbox.New(inbox.Options{Consumer: "readmodel-" + f.TopicPrefix, DB: pool, Handler: flaky, Brokers: f.Brokers, Topics: topics,
			Group: "readmodel-" + f.TopicPrefix, Table: inboxTable, DeadLetterTopic: f.TopicPrefix + ".readmodel.dlq",
			RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Setup(ctx); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- in.Run(cctx) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("consumer: %v", err)
				}
				in.Close()
			})
		}
		t.Cleanup(stop)
		return in, stop
	}
	first, stopFirst := consumer()
	var second *inbox.Inbox

	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)

	// One writer: transactions of 1 to 20 order events over 60 orders, a third deleted in their own
	// transaction.
	var all []testenv.Event
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		versions := map[string]int64{}
		for i := 0; ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			evs := make([]testenv.Event, 1+rng.IntN(20))
			for j := range evs {
				order := fmt.Sprintf("order-%d", rng.IntN(60))
				versions[order]++
				evs[j] = testenv.Event{ID: testenv.NewUUID(), Type: types[rng.IntN(2)], AggType: "order", AggID: order, Version: versions[order],
					Payload: fmt.Sprintf(`{"amount_cents": %d}`, 1+rng.IntN(100000))}
			}
			if err := testenv.InsertTx(ctx, f.DB, f.Table, evs, rng.IntN(3) == 0); err != nil {
				writerDone <- err
				return
			}
			mu.Lock()
			all = append(all, evs...)
			mu.Unlock()
			time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
		}
	}()

	const kills = 6
	rng := rand.New(rand.NewPCG(9, 9))
	for k := 1; k <= kills; k++ {
		r.waitLog(t, "streaming", 60*time.Second)
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
		r = r.killAndRestart(t, env)
		switch k {
		case 2:
			second, _ = consumer()
		case 4:
			stopFirst()
		}
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	want := map[string]readmodel.Row{}
	for _, e := range all {
		var amount int64
		_, _ = fmt.Sscanf(e.Payload, `{"amount_cents": %d}`, &amount)
		row := want[e.AggID]
		row.OrderID, row.Events, row.AmountCents, row.LastVersion = e.AggID, row.Events+1, row.AmountCents+amount, max(row.LastVersion, e.Version)
		want[e.AggID] = row
	}
	events := int64(len(all))
	mu.Unlock()

	counted := func() int64 {
		got, err := model.Read(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, row := range got {
			n += row.Events
		}
		return n
	}
	testenv.WaitFor(t, 3*time.Minute, "the read model to count every event", func() bool { return counted() >= events })
	time.Sleep(2 * time.Second) // duplicates still in flight would show now
	got, err := model.Read(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for order, w := range want {
		if got[order] != w {
			t.Errorf("order %s: read model %+v, want %+v", order, got[order], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("read model has %d orders, want %d", len(got), len(want))
	}
	s1, s2 := first.Stats(), second.Stats()
	t.Logf("%d events, %d router kills; first consumer %+v; second %+v", events, kills, s1, s2)
	if s1.DeadLettered+s2.DeadLettered != 0 {
		t.Errorf("events were dead-lettered")
	}
	if s1.Failures+s2.Failures == 0 {
		t.Error("the injected handler failures never happened")
	}
}
