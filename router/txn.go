package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/checkpoint"
)

// Transactions turn on the exactly-once mode: records are produced in Kafka transactions, each of
// which also writes a checkpoint record, and one instance fences every older one.
type Transactions struct {
	// Slot identifies the replication slot: it keys the checkpoint records and names the
	// transactional id, so that every instance of the slot shares it.
	Slot checkpoint.SlotID
	// Topic is the compacted checkpoint topic, created with one partition when missing.
	Topic string
	// Timeout is the Kafka transaction timeout.
	Timeout time.Duration
	// Lanes is how many transactional producers take turns (0: 2). With two, the next Kafka
	// transaction begins on the second while the first one's EndTxn and settle run, so that records
	// never wait for them; its EndTxn follows the first one's end, so transactions commit in order.
	// The second lane's transactional id is the slot's with "#2" appended. With 1 (or when the Kafka
	// principal may not use the second id), records produced during a commit wait for its end.
	Lanes int
}

// maxLanes is the most transactional producers a router takes turns with.
const maxLanes = 2

// lanes is Lanes with its default.
func (t *Transactions) lanes() int {
	if t.Lanes <= 0 || t.Lanes > maxLanes {
		return maxLanes
	}
	return t.Lanes
}

// laneID is the transactional id of lane i: the slot's for the first, with "#<i+1>" appended for
// the others ('#' is never part of a slot name, so no other slot's id can be the same).
func (t *Transactions) laneID(i int) string {
	if i == 0 {
		return t.Slot.TransactionalID()
	}
	return fmt.Sprintf("%s#%d", t.Slot.TransactionalID(), i+1)
}

// ErrFenced is returned (wrapped) when another instance has taken over the slot's transactional id:
// this one must not write again.
var ErrFenced = errors.New("fenced: another instance took over this slot's Kafka transactions")

// ErrTxnTimedOut is returned (wrapped) when a Kafka transaction stayed open longer than
// kafka.transaction_timeout and the transaction coordinator aborted it (which Kafka reports as
// fencing): nothing of it is visible, and the session replays it.
var ErrTxnTimedOut = errors.New("the Kafka transaction stayed open longer than kafka.transaction_timeout and the transaction coordinator aborted it")

// fenced reports Kafka's ways of saying that a newer producer holds the transactional id.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// transactional reports whether the router produces in Kafka transactions.
func (r *Router) transactional() bool { return r.opts.Transactions != nil }

// Fence makes this router the only writer of the slot's transactional id: Kafka aborts whatever
// transaction an older instance left open and refuses its later writes. Call it once the replication
// slot is held, before ReadCheckpoint, so that no older instance can commit after the read.
func (r *Router) Fence(ctx context.Context) error {
	if !r.transactional() {
		return nil
	}
	for i, c := range r.lanes {
		_, _, err := c.ProducerID(ctx)
		if err == nil {
			continue
		}
		id := r.opts.Transactions.laneID(i)
		if errors.Is(err, kerr.InvalidTransactionTimeout) {
			return fmt.Errorf("%w: kafka.transaction_timeout (%s) is above the brokers' transaction.max.timeout.ms: lower it, or raise the broker setting: %w",
				ErrConfig, r.opts.Transactions.Timeout, err)
		}
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
			if i > 0 && errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
				// Allowed the slot's own id only: one lane works, commits just do not overlap.
				r.log.Warn("the Kafka principal may not use the second transactional id: committing with one producer, so records produced during a commit wait for its end (grant WRITE on it, e.g. a prefixed ACL on the slot's id)",
					"transactional_id", id)
				for _, extra := range r.lanes[i:] {
					extra.Close()
				}
				r.lanes = r.lanes[:i]
				return nil
			}
			return fmt.Errorf("%w: the Kafka principal may not use transactional id %s (WRITE on it, and IDEMPOTENT_WRITE on the cluster before Kafka 3.0): %w",
				ErrConfig, id, err)
		}
		return fmt.Errorf("initialize the transactional producer %s: %w", id, err)
	}
	return nil
}

// producer is the client records go to now, and its lane.
func (r *Router) producer() (*kgo.Client, int) {
	i := int(r.lane.Load())
	return r.lanes[i], i
}

// TransactionState is what Kafka's transaction coordinator knows of the slot's transactional id,
// asked before Fence changes it: its last transaction's state (Empty, Ongoing, CompleteCommit,
// CompleteAbort, ...), or "" when the id is unknown to it (never used, or expired after
// transactional.id.expiration.ms) or the brokers are too old to say (before Kafka 3.0).
//
// With two lanes, it is CompleteCommit when either lane's last transaction committed, and otherwise
// the first lane's state.
func (r *Router) TransactionState(ctx context.Context) (string, error) {
	var first string
	for i := range r.lanes {
		state, err := r.transactionState(ctx, r.opts.Transactions.laneID(i))
		if i > 0 && errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			break // Fence goes on with the first lane alone
		}
		if err != nil {
			return "", err
		}
		if state == "CompleteCommit" {
			return state, nil
		}
		if i == 0 {
			first = state
		}
	}
	return first, nil
}

// transactionState is TransactionState of one transactional id.
func (r *Router) transactionState(ctx context.Context, id string) (string, error) {
	described, err := r.admin.DescribeTransactions(ctx, id)
	if err != nil {
		if errors.Is(err, kerr.UnsupportedVersion) || errors.Is(err, kerr.TransactionalIDNotFound) || errors.Is(err, kerr.CoordinatorNotAvailable) {
			return "", nil
		}
		return "", fmt.Errorf("describe transactional id %s: %w", id, err)
	}
	d, ok := described[id]
	if !ok || errors.Is(d.Err, kerr.TransactionalIDNotFound) {
		return "", nil
	}
	if d.Err != nil {
		return "", fmt.Errorf("describe transactional id %s: %w", id, d.Err)
	}
	return d.State, nil
}

// begin opens a Kafka transaction on the current lane if none is open there. Prepare's goroutine,
// or a commit's while it switches lanes.
func (r *Router) begin() error {
	if !r.transactional() {
		return nil
	}
	client, lane := r.producer()
	if r.inTxn[lane] {
		return nil
	}
	if err := client.BeginTransaction(); err != nil {
		return fmt.Errorf("begin kafka transaction: %w", err)
	}
	r.inTxn[lane] = true
	r.txnRecords = 0
	r.txnBegan[lane].Store(time.Now().UnixNano())
	return nil
}

// Commit ends the open Kafka transaction with the checkpoint cp and waits for the end: StartCommit
// and WaitCommit. When it returns nil, everything produced since the last commit, and cp, are
// committed together.
func (r *Router) Commit(ctx context.Context, cp checkpoint.Record) error {
	if err := r.StartCommit(ctx, cp, nil); err != nil {
		return err
	}
	return r.WaitCommit(ctx) // a failed commit is the router's failure
}

// StartCommit ends the open Kafka transaction with the checkpoint cp in the background: it produces
// the checkpoint record, and then, on a goroutine of its own, waits until every record of the
// transaction is acknowledged, commits, and waits until the transaction is complete on its
// coordinator (settle). Records produced meanwhile wait, in order, until every record of the
// transaction is acknowledged; with two lanes (Transactions.Lanes) they then go into the next
// transaction, on the other producer, while this one's EndTxn runs; with one, once it is over. So
// the stream goes on reading while Kafka commits, and with two lanes records do not wait for
// EndTxn. Transactions still commit in order: a commit's EndTxn waits for the end of the one before.
//
// ended, if not nil, is called on that goroutine with the result, in commit order, before anything
// produced meanwhile is sent (one lane) or before the next commit's EndTxn (two); what it returns
// for an error is the router's failure (it may add to the error). On any error the router fails and
// the session must replay from the slot; the transactions are left for Abort (or for the next
// instance's fencing) to abort, and the records produced meanwhile are never acknowledged in a
// committed transaction. With no transaction open, StartCommit opens one to hold only the checkpoint
// (an idle checkpoint). A checkpoint at position zero is not written (a resync's snapshot
// transactions before the last). StartCommit first waits until the commit before has let records
// go on (and that one's failure is returned); WaitCommit waits for the last one's end. ctx bounds
// the commit.
func (r *Router) StartCommit(ctx context.Context, cp checkpoint.Record, ended func(error) error) error {
	if !r.transactional() {
		return errors.New("router: Commit without transactions")
	}
	if err := r.waitSwitched(ctx); err != nil {
		return err
	}
	if err := r.Err(); err != nil {
		return err
	}
	if err := r.begin(); err != nil {
		r.fail(err)
		return err
	}
	client, lane := r.producer()
	start := time.Now()
	cp.Slot, cp.Written = r.opts.Transactions.Slot, start.UTC()
	cp.Records = r.txnRecords
	var cpErr error
	if cp.LSN != 0 {
		rec := &kgo.Record{Topic: r.opts.Transactions.Topic, Key: []byte(cp.Slot.String()), Value: cp.Marshal()}
		client.Produce(ctx, rec, func(_ *kgo.Record, err error) { cpErr = err })
	}
	done := make(chan struct{})
	r.txnMu.Lock()
	r.committing = make(chan struct{})
	before := r.ending // the commit before, if it has not ended: this one's EndTxn follows its end
	r.ending = done
	r.txnMu.Unlock()
	// The commit ends with the router too (Close).
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.closeCtx, cancel)
	go func() {
		defer close(done)
		defer cancel()
		defer stop()
		c := TxnCommit{Records: cp.Records}
		err := r.flushTxn(ctx, client, &cpErr, &c)
		if err == nil && before != nil {
			// The other lane is free, and this transaction may commit, once the one before has ended.
			select {
			case <-before:
				err = r.Err()
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		// With two lanes, records go on into the other lane's next transaction now; with one, or
		// after a failure (the router failed first, so that they are released unsent), at the end.
		early := err == nil && len(r.lanes) > 1
		if early {
			r.switchLane(lane, nil)
		}
		if err == nil {
			endStart := time.Now()
			err = client.EndTransaction(ctx, kgo.TryCommit)
			c.End = time.Since(endStart)
		}
		if err == nil {
			r.inTxn[lane] = false
			r.opts.Counters.TransactionsCommitted.Add(1)
			settled := time.Now()
			c.SettleAsks = r.settle(lane)
			c.Settle = time.Since(settled)
			if r.opts.Observer != nil {
				if o, ok := r.opts.Observer.(TxnObserver); ok {
					o.TransactionCommitted(c)
				}
			}
		} else {
			// The transaction stays open until Abort: the caller lets go of PostgreSQL first, since
			// an abort waits for Kafka, which may be what failed.
			err = r.wrapTxnErr("commit kafka transaction", lane, err)
		}
		if ended != nil {
			err = ended(err)
		}
		if err != nil {
			r.fail(err)
		}
		if !early {
			r.switchLane(lane, err)
		}
	}()
	return nil
}

// switchLane lets the records produced during a commit on lane go on, into the next lane's next
// transaction (the same lane with one), or, after a failure, releases them unsent. The commit
// goroutine only.
func (r *Router) switchLane(lane int, err error) {
	r.txnMu.Lock()
	defer r.txnMu.Unlock()
	if err == nil {
		r.lane.Store(int32((lane + 1) % len(r.lanes)))
	}
	for i, h := range r.queued {
		r.queued[i] = waitingRecord{}
		r.produceNow(h.p, h.ack) // after a failure, releases the record without sending it
	}
	r.queued = r.queued[:0]
	close(r.committing)
	r.committing = nil
}

// flushTxn waits for the open transaction's records (held ones included) on client, noting in c how
// long it took. The commit goroutine only.
func (r *Router) flushTxn(ctx context.Context, client *kgo.Client, cpErr *error, c *TxnCommit) error {
	start := time.Now()
	defer func() { c.Flush = time.Since(start) }()
	// Records held for new topics go first, into this transaction.
	if err := r.drainWaiting(ctx); err != nil {
		return err
	}
	if err := client.Flush(ctx); err != nil {
		return err
	}
	if *cpErr != nil {
		return *cpErr // set by the checkpoint record's promise, which Flush waited for
	}
	return r.Err()
}

// waitSwitched waits until the commit StartCommit began last, if any, lets records go on.
func (r *Router) waitSwitched(ctx context.Context) error {
	r.txnMu.Lock()
	switched := r.committing
	r.txnMu.Unlock()
	if switched == nil {
		return nil
	}
	select {
	case <-switched:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the kafka commit: %w", ctx.Err())
	}
}

// WaitCommit waits until the commits StartCommit began, if any, have ended, and returns the
// router's failure, if any: a commit that failed before WaitCommit was called is reported too.
func (r *Router) WaitCommit(ctx context.Context) error {
	r.txnMu.Lock()
	done := r.ending
	r.txnMu.Unlock()
	if done == nil {
		return r.Err() // ended already: its failure, if it failed, is the router's
	}
	select {
	case <-done:
		return r.Err()
	case <-ctx.Done():
		return fmt.Errorf("wait for the kafka commit: %w", ctx.Err())
	}
}

// settleWait bounds how long the next transaction waits for the last one to complete on its
// coordinator: past it, the broker's own retries take over.
const settleWait = 50 * time.Millisecond

// settlePause is the pause between the first two questions settle asks the coordinator; each
// later pause doubles, up to settlePauseMax. Markers are mostly written within a round trip or
// two, so the first pause is short; a coordinator that is slow (a broker short of CPU) is asked
// a few times within settleWait instead of once per round trip.
const (
	settlePause    = time.Millisecond
	settlePauseMax = 8 * time.Millisecond
)

// settle asks the transaction coordinator until the transaction just committed on lane is complete.
// EndTxn returns once the commit is decided, before its markers are written; a record produced into
// the next transaction of the same transactional id meanwhile is answered CONCURRENT_TRANSACTIONS
// inside the broker, which retries after add.partitions.to.txn.retry.backoff.ms (20 ms by default;
// franz-go's own backoff for the same answer before transactions v2 is 20 ms too). Asking takes a
// round trip or two, so the lane's next transaction begins within about a millisecond of the
// markers instead of 20 ms later. With two lanes the other lane takes records meanwhile; with one
// they wait. Between questions it pauses (settlePause, doubling), so that a slow coordinator is not
// asked once per round trip. Any error ends the wait; the broker's retries are still there. It
// returns how many questions it asked.
func (r *Router) settle(lane int) (asked int) {
	ctx, cancel := context.WithTimeout(r.closeCtx, settleWait)
	defer cancel()
	id := r.opts.Transactions.laneID(lane)
	pause := settlePause
	for ctx.Err() == nil {
		asked++
		described, err := r.admin.DescribeTransactions(ctx, id)
		if err != nil {
			r.log.Debug("ask whether the last kafka transaction is complete", "error", err.Error())
			return asked
		}
		switch d := described[id]; {
		case d.Err != nil:
			r.log.Debug("ask whether the last kafka transaction is complete", "error", d.Err.Error())
			return asked
		case !strings.HasPrefix(d.State, "Prepare"): // PrepareCommit, PrepareAbort, PrepareEpochFence
			return asked
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return asked
		}
		pause = min(2*pause, settlePauseMax)
	}
	return asked
}

// TxnObserver is an Observer that is also told of every committed Kafka transaction (exactly-once
// mode).
type TxnObserver interface {
	TransactionCommitted(TxnCommit)
}

// TxnCommit is what one committed Kafka transaction held and where its commit's time went.
type TxnCommit struct {
	// Records is how many records it held, the checkpoint record not counted.
	Records int
	// Flush is the wait for every record's acknowledgement (the checkpoint's included), after the
	// stream decided to commit.
	Flush time.Duration
	// End is the EndTxn round trip: the commit decided by the transaction coordinator.
	End time.Duration
	// Settle is the wait, after EndTxn, until the coordinator had written the commit markers
	// (records produced meanwhile wait for it; see settle).
	Settle time.Duration
	// SettleAsks is how many times settle asked the coordinator (DescribeTransactions).
	SettleAsks int
}

// Latency is the commit's latency as the commit-seconds histogram counts it: flush and EndTxn.
func (c TxnCommit) Latency() time.Duration { return c.Flush + c.End }

// Abort aborts the open Kafka transaction, if any, so that read_uncommitted consumers are told soon
// and the next session need not wait for the broker to abort it. It waits for Kafka up to 5 s: call
// it after letting go of PostgreSQL. Best effort: fencing at the next start aborts it anyway.
func (r *Router) Abort() {
	if !r.transactional() {
		return
	}
	r.abort()
}

func (r *Router) abort() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.WaitCommit(ctx); err != nil && r.Err() == nil {
		// Still committing after 5 s: ending the transaction now would race the commit.
		r.log.Debug("abort: a kafka commit still runs", "error", err.Error())
		return
	}
	for lane, client := range r.lanes {
		if err := client.AbortBufferedRecords(ctx); err != nil {
			r.log.Debug("abort buffered records", "error", err.Error())
		}
		if err := client.EndTransaction(ctx, kgo.TryAbort); err != nil {
			if fenced(err) {
				r.log.Warn("fenced: another instance took over this slot's Kafka transactions; what this one produced since its last commit is void",
					"transactional_id", r.opts.Transactions.laneID(lane))
			} else {
				r.log.Debug("abort kafka transaction", "error", err.Error())
			}
		}
		if r.inTxn[lane] {
			r.opts.Counters.TransactionsAborted.Add(1)
		}
		r.inTxn[lane] = false
	}
	r.lane.Store(0)
	r.txnRecords = 0
}

// wrapTxnErr names what Kafka reports as fencing truthfully: a transaction that stayed open longer
// than its timeout was aborted by the coordinator; otherwise another instance took over.
func (r *Router) wrapTxnErr(what string, lane int, err error) error {
	if !fenced(err) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if began := r.txnBegan[lane].Load(); began != 0 {
		if open := time.Since(time.Unix(0, began)); open >= r.opts.Transactions.Timeout {
			return fmt.Errorf("%s: %w (open %s, kafka.transaction_timeout %s; raise it, and the brokers' transaction.max.timeout.ms, above the time the largest PostgreSQL transaction takes to deliver): %w",
				what, ErrTxnTimedOut, open.Round(time.Millisecond), r.opts.Transactions.Timeout, err)
		}
	}
	return fmt.Errorf("%s: %w (transactional id %s): %w", what, ErrFenced, r.opts.Transactions.laneID(lane), err)
}
