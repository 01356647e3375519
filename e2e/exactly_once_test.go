package e2e

import (
	"context"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// eosEnv is routerEnv in exactly-once mode with the fixture's own checkpoint topic.
func eosEnv(f *testenv.Fixture) []string {
	return append(routerEnv(f), "OUTBOX_CDC_DELIVERY=exactly-once", "OUTBOX_CDC_CHECKPOINT_TOPIC="+f.TopicPrefix+".checkpoints")
}

// TestExactlyOnceUnderKills SIGKILLs the exactly-once router 20 times at random moments while single
// rows, 100-row transactions, rows deleted by their own transaction and a 5,000-row COPY are written:
// a read_committed consumer must see every committed event exactly once, per aggregate in commit
// order. The duplicates a read_uncommitted consumer sees (records of aborted transactions) are
// printed for comparison.
func TestExactlyOnceUnderKills(t *testing.T) {
	f := testenv.NewFixture(t)
	env := eosEnv(f)
	gen := testenv.NewGenerator(40, "PaymentAuthorized", "PaymentCaptured")
	topics := testenv.TopicsOf(f, "PaymentAuthorized", "PaymentCaptured")
	ctx := context.Background()

	r := startRouter(t, env)
	r.waitLog(t, "streaming", 60*time.Second)

	// Writers: single rows and 100-row transactions (a third deleted by their own transaction) in
	// one connection, and one 5,000-row COPY in the middle of the kills.
	var mu sync.Mutex
	var all []testenv.Event
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(7, 11))
		for i := 0; ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			n := 1
			if rng.IntN(4) == 0 {
				n = 100
			}
			mu.Lock() // the generator and the connection are shared with the COPY
			evs := make([]testenv.Event, n)
			for j := range evs {
				evs[j] = gen.Event(rng.IntN(40))
			}
			err := testenv.InsertTx(ctx, f.DB, f.Table, evs, rng.IntN(3) == 0)
			if err == nil {
				all = append(all, evs...)
			}
			mu.Unlock()
			if err != nil {
				writerDone <- err
				return
			}
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
		}
	}()

	const kills = 20
	rng := rand.New(rand.NewPCG(3, 5))
	for k := 0; k < kills; k++ {
		if k == kills/2 {
			mu.Lock()
			copied := make([]testenv.Event, 5000)
			for i := range copied {
				copied[i] = gen.Event(rng.IntN(40))
			}
			_, err := copyEvents(ctx, f.DB, f.Table, copied)
			if err == nil {
				all = append(all, copied...)
			}
			mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
		// A random moment: sometimes during start-up, mostly while streaming.
		if rng.IntN(4) != 0 {
			r.waitLog(t, "streaming", 60*time.Second)
		}
		time.Sleep(time.Duration(50+rng.IntN(1500)) * time.Millisecond)
		if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-r.done
		r = startRouter(t, env)
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	r.waitLog(t, "streaming", 60*time.Second)
	mu.Lock()
	want := append([]testenv.Event(nil), all...)
	mu.Unlock()

	got := testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), 3*time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	dups := testenv.VerifyDelivery(t, f, want, got)
	if dups != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates after %d kills, want 0", dups, kills)
	}
	uncommitted := testenv.ConsumeDistinct(t, f.Brokers, topics, len(want), time.Minute)
	rep := testenv.CheckDelivery(f.TopicPrefix, want, uncommitted)
	t.Logf("%d events, %d kills: read_committed saw %d records (%d duplicates); read_uncommitted saw %d records (%d duplicates from aborted transactions)",
		len(want), kills, len(got), dups, len(uncommitted), rep.Duplicates)
}
