package router

import (
	"context"
	"slices"
	"strings"
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
// (its EndTxn held by the broker), a record produced meanwhile never lands in the transaction being
// ended. With one lane it is not sent until the commit ended, then goes, in order, into the next
// transaction; if the commit fails, it is never sent and never acknowledged (the session replays
// it). With two lanes it goes at once into the next transaction on the other producer: read_committed
// consumers see it only once that one commits, after the first; if the first commit fails, they never
// see it. (Checked by breaking it: with Produce sending at once during a commit on one lane, the
// record is acknowledged while EndTxn is held; with two lanes and no lane switch, it joins the
// transaction being ended and read_committed sees it before the second commit.)
func TestRecordsProducedDuringACommitWaitForTheNext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		endFail bool
		lanes   int
		overlap bool // the next commit begins while the first one's EndTxn is held
	}{
		{"commit succeeds", false, 1, false}, {"commit fails", true, 1, false},
		{"two lanes, commit succeeds", false, 2, false}, {"two lanes, commit fails", true, 2, false},
		{"two lanes, commits in order", false, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "checkpoints"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			release, inEndTxn := make(chan struct{}), make(chan struct{})
			var first sync.Once
			var endTxns atomic.Int32
			c.ControlKey(kmsg.EndTxn.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				endTxns.Add(1)
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
				o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: 30 * time.Second, Lanes: tc.lanes}
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
			if tc.lanes == 1 {
				time.Sleep(300 * time.Millisecond) // room for a wrongly sent record to be acknowledged
				if second.Load() != 0 {
					t.Fatal("a record produced during the commit was sent into the transaction being ended")
				}
			} else {
				// Sent at once, into the other lane's transaction, while EndTxn is held.
				testWait(t, 10*time.Second, func() bool { return second.Load() == 1 })
				if ids := readCommittedFor(t, ctx, c, 300*time.Millisecond); len(ids) != 0 {
					t.Fatalf("read_committed read %v while the first commit's EndTxn was held, want nothing", ids)
				}
			}
			if tc.overlap {
				// The next commit flushes, but its EndTxn waits for the first one's end.
				if err := r.StartCommit(ctx, checkpoint.Record{LSN: 150}, nil); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond)
				if n := endTxns.Load(); n != 1 {
					t.Fatalf("%d EndTxn requests while the first was held, want 1: the second transaction would commit first", n)
				}
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
				if tc.lanes == 1 {
					time.Sleep(300 * time.Millisecond)
					if second.Load() != 0 {
						t.Fatal("a record produced during a failed commit was sent and acknowledged")
					}
					return
				}
				// Two lanes: the next transaction, with the record, is aborted; read_committed never
				// sees it (nor the first transaction's record).
				if err := r.StartCommit(ctx, checkpoint.Record{LSN: 200}, nil); err == nil {
					t.Fatal("a commit began after the one before had failed")
				}
				r.Abort()
				// The next instance fences both lanes: whatever stayed open is aborted.
				next := testRouter(t, c, func(o *Options) {
					o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: 30 * time.Second, Lanes: tc.lanes}
				})
				if err := next.Fence(ctx); err != nil {
					t.Fatal(err)
				}
				if ids := readCommitted(t, ctx, c, "sentinel"); len(ids) != 1 || ids[0] != "sentinel" {
					t.Fatalf("read_committed read %v after a failed commit, want only the sentinel", ids)
				}
				return
			}
			if werr != nil {
				t.Fatal(werr)
			}
			testWait(t, 10*time.Second, func() bool { return second.Load() == 1 })
			if tc.lanes > 1 && !tc.overlap {
				// Committed: the first transaction, not the record produced during its commit.
				if ids := readCommittedFor(t, ctx, c, time.Second); len(ids) != 1 || ids[0] != "e1" {
					t.Fatalf("read_committed read %v before the second commit, want [e1]", ids)
				}
			}
			if err := r.Commit(ctx, checkpoint.Record{LSN: 200}); err != nil {
				t.Fatal(err)
			}
			ids := readCommitted(t, ctx, c, "sentinel2")
			if len(ids) != 3 || ids[0] != "e1" || ids[1] != "e2" {
				t.Fatalf("read_committed read %v, want [e1 e2 sentinel2]", ids)
			}
			if last, err := r.ReadCheckpoint(ctx); err != nil || last == nil || last.LSN != 200 {
				t.Fatalf("last checkpoint %+v (%v), want the second commit's", last, err)
			}
		})
	}
}

// readCommitted produces sentinel to "orders" outside any transaction, and returns the event ids a
// read_committed consumer reads from the start of "orders" up to it (the sentinel's included): once
// it is read, every transaction before it that is still open holds it back, so what was read is
// everything committed.
func readCommitted(t *testing.T, ctx context.Context, c *kfake.Cluster, sentinel string) []string {
	t.Helper()
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	rec := &kgo.Record{Topic: "orders", Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(sentinel)}}}
	if err := plain.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var ids []string
	for ctx.Err() == nil && !slices.Contains(ids, sentinel) {
		cons.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			for _, h := range rec.Headers {
				if h.Key == "event_id" {
					ids = append(ids, string(h.Value))
				}
			}
		})
	}
	if ctx.Err() != nil {
		t.Fatalf("read_committed never reached %s (read %v): a transaction before it stayed open", sentinel, ids)
	}
	return ids
}

// readCommittedFor returns the event ids a read_committed consumer reads from the start of "orders"
// within d.
func readCommittedFor(t *testing.T, ctx context.Context, c *kfake.Cluster, d time.Duration) []string {
	t.Helper()
	cons, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var ids []string
	for ctx.Err() == nil {
		cons.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			for _, h := range rec.Headers {
				if h.Key == "event_id" {
					ids = append(ids, string(h.Value))
				}
			}
		})
	}
	return ids
}

// TestSecondLaneRefusedCommitsWithOne: a Kafka principal allowed the slot's transactional id but not
// the second producer's (an ACL on the exact id) is not a configuration error: the router warns and
// commits with one producer. (Checked by breaking it: returning the error fails Fence.)
func TestSecondLaneRefusedCommitsWithOne(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(kmsg.InitProducerID.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if id := req.(*kmsg.InitProducerIDRequest).TransactionalID; id == nil || !strings.HasSuffix(*id, "#2") {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp, nil, true
	})
	r := testRouter(t, c, func(o *Options) {
		o.Transactions = &Transactions{Slot: checkpoint.SlotID{SystemID: "1", Database: "db", Slot: "s"}, Topic: "checkpoints", Timeout: 30 * time.Second}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Fence(ctx); err != nil {
		t.Fatalf("Fence with the second transactional id refused: %v, want one producer", err)
	}
	if n := len(r.lanes); n != 1 {
		t.Fatalf("%d producers after the second id was refused, want 1", n)
	}
	for i, id := range []string{"e1", "e2"} {
		if err := send(t, r, row("orders", id), func() {}); err != nil {
			t.Fatal(err)
		}
		if err := r.Commit(ctx, checkpoint.Record{LSN: checkpoint.LSN(100 * (i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	if ids := readCommitted(t, ctx, c, "sentinel"); len(ids) != 3 || ids[0] != "e1" || ids[1] != "e2" {
		t.Fatalf("read_committed read %v, want [e1 e2 sentinel]", ids)
	}
}
