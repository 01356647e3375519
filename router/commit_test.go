package router

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// TestRecordsProducedDuringACommitWaitForTheNext: while a Kafka transaction commits in the background
// (its EndTxn held by the broker), a record produced meanwhile is not sent — it would land in the
// transaction being ended — and goes, in order, into the next one once the commit ended; if the commit
// fails, it is never sent and never acknowledged (the session replays it). (Checked by breaking it:
// with Produce sending at once during a commit, the record is acknowledged while EndTxn is held.)
func TestRecordsProducedDuringACommitWaitForTheNext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		endFail bool
	}{{"commit succeeds", false}, {"commit fails", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "checkpoints"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			release, inEndTxn := make(chan struct{}), make(chan struct{})
			var first sync.Once
			c.ControlKey(kmsg.EndTxn.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				held := false
				first.Do(func() { held = true })
				if !held {
					return nil, nil, false
				}
				close(inEndTxn)
				c.SleepControl(func() { <-release })
				if tc.endFail {
					resp := req.ResponseKind().(*kmsg.EndTxnResponse)
					resp.ErrorCode = kerr.InvalidTxnState.Code
					return resp, nil, true
				}
				return nil, nil, false
			})
			r := testRouter(t, c, func(o *Options) {
				o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: 30 * time.Second}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := r.Fence(ctx); err != nil {
				t.Fatal(err)
			}
			var first1, second atomic.Int32
			if err := send(t, r, row("orders", "e1"), func() { first1.Add(1) }); err != nil {
				t.Fatal(err)
			}
			var ended atomic.Value
			if err := r.StartCommit(ctx, checkpoint.Record{LSN: 100}, func(err error) error {
				ended.Store([]error{err})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-inEndTxn:
			case <-ctx.Done():
				t.Fatal("EndTxn never reached the broker")
			}
			if err := send(t, r, row("orders", "e2"), func() { second.Add(1) }); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // room for a wrongly sent record to be acknowledged
			if second.Load() != 0 {
				t.Fatal("a record produced during the commit was sent into the transaction being ended")
			}
			close(release)
			werr := r.WaitCommit(ctx)
			if first1.Load() != 1 {
				t.Fatalf("the committed transaction's record was acknowledged %d times, want 1", first1.Load())
			}
			if tc.endFail {
				if werr == nil || r.Err() == nil {
					t.Fatalf("a failed commit: WaitCommit %v, router error %v; want both", werr, r.Err())
				}
				// The commit has ended: WaitCommit called now must still report its failure (finish
				// would otherwise take a failed last commit for a committed one).
				if err := r.WaitCommit(ctx); err == nil {
					t.Fatal("WaitCommit after a failed commit had ended returned nil, want the commit's error")
				}
				if e, _ := ended.Load().([]error); len(e) != 1 || e[0] == nil {
					t.Fatalf("ended was told %v, want the commit's error", e)
				}
				time.Sleep(300 * time.Millisecond)
				if second.Load() != 0 {
					t.Fatal("a record produced during a failed commit was sent and acknowledged")
				}
				return
			}
			if werr != nil {
				t.Fatal(werr)
			}
			testWait(t, 10*time.Second, func() bool { return second.Load() == 1 })
			if err := r.Commit(ctx, checkpoint.Record{LSN: 200}); err != nil {
				t.Fatal(err)
			}
			cons, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			var ids []string
			for len(ids) < 2 && ctx.Err() == nil {
				cons.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
					for _, h := range rec.Headers {
						if h.Key == "event_id" {
							ids = append(ids, string(h.Value))
						}
					}
				})
			}
			if len(ids) != 2 || ids[0] != "e1" || ids[1] != "e2" {
				t.Fatalf("read_committed read %v, want [e1 e2]", ids)
			}
		})
	}
}
