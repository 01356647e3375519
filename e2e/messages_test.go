package e2e

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestMessagesUnderKills SIGKILLs the router 10 times at random moments while transactions write
// events as WAL messages (OUTBOX_CDC_MESSAGE_PREFIXES) and as rows, mixed within transactions, with a
// 2,000-message transaction in the middle: every committed event arrives, per aggregate in commit
// order; in exactly-once mode a read_committed consumer sees no duplicate.
func TestMessagesUnderKills(t *testing.T) {
	f := testenv.NewFixture(t)
	env := append(routerEnv(f), "OUTBOX_CDC_MESSAGE_PREFIXES=outbox,other-app")
	types := []string{"StockReserved", "StockReleased"}
	gen := testenv.NewGenerator(30, types...)
	ctx := context.Background()

	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)

	var mu sync.Mutex
	var all []testenv.Event
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	write := func(rng *rand.Rand, n int) error {
		tx, err := f.DB.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		evs := make([]testenv.Event, n)
		for j := range evs {
			evs[j] = gen.Event(rng.IntN(30))
			if rng.IntN(4) == 0 {
				err = testenv.InsertIn(ctx, tx, f.Table, evs[j:j+1], rng.IntN(2) == 0)
			} else {
				err = testenv.EmitIn(ctx, tx, "outbox", evs[j:j+1])
			}
			if err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		all = append(all, evs...)
		return nil
	}
	go func() {
		rng := rand.New(rand.NewPCG(5, 13))
		for {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			mu.Lock() // the generator and the connection are shared with the burst
			err := write(rng, 1+rng.IntN(8))
			mu.Unlock()
			if err != nil {
				writerDone <- err
				return
			}
			time.Sleep(time.Duration(rng.IntN(4)) * time.Millisecond)
		}
	}()

	const kills = 10
	rng := rand.New(rand.NewPCG(17, 19))
	for k := 0; k < kills; k++ {
		if k == kills/2 {
			mu.Lock()
			err := write(rng, 2000)
			mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(4) != 0 {
			r.waitLog(t, "streaming", 60*time.Second)
		}
		time.Sleep(time.Duration(50+rng.IntN(1200)) * time.Millisecond)
		r = r.killAndRestart(t, env)
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	r.waitLog(t, "streaming", 60*time.Second)
	mu.Lock()
	want := append([]testenv.Event(nil), all...)
	mu.Unlock()

	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, types...), len(want), 3*time.Minute, testenv.ConsumerOpts()...)
	dups := testenv.VerifyDelivery(t, f, want, got)
	if testenv.Delivery() == "exactly-once" && dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates after %d kills, want 0 in exactly-once mode", dups, kills)
	}
	t.Logf("%s: %d events (most as WAL messages), %d kills: %d records, %d duplicates", testenv.Delivery(), len(want), kills, len(got), dups)
}
