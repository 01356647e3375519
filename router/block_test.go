package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outbox-cdc/outbox-cdc/internal/pin"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// The stream's and the snapshot's rows are charged for their blocks.
var _ blockRow = (*replication.Row)(nil)

// blockedRow is a row carved from a block of memory shared with other rows, as replication's are.
type blockedRow struct {
	mapRow
	block *pin.Block
}

func (b blockedRow) Block() *pin.Block { return b.block }

// TestHeldRecordsChargeTheirBlocks: one partition does not acknowledge (NOT_ENOUGH_REPLICAS, which
// the producer retries) while the other topic flows; one row in five goes to it, each from a block
// of its own. Every record held keeps its whole block alive, so the byte cap must count the blocks:
// the router stops taking rows once the held blocks fill it, instead of holding a block per record up
// to the records' cap (memory bounded by limits.max_inflight_bytes, whatever the rows' pattern).
func TestHeldRecordsChargeTheirBlocks(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "stuck"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	failProduce(c, "stuck", kerr.NotEnoughReplicas.Code)
	const blockSize, maxBytes = 32 << 10, 256 << 10
	counters := new(Counters)
	r := testRouter(t, c, func(o *Options) {
		o.Limits.MaxInFlightRecords, o.Limits.MaxInFlightBytes = 1000, maxBytes
		o.Counters = counters
		o.ExtraOpts = []kgo.Opt{kgo.MaxVersions(kversion.V3_9_0())} // produce requests that name their topics (failProduce)
	})
	held, prepared := 0, 0
	for i := range 400 {
		topic := "orders"
		if i%5 == 0 {
			topic = "stuck"
		}
		rw := blockedRow{row(topic, fmt.Sprint("e", i)), pin.NewBlock(blockSize)}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		p, err := r.Prepare(ctx, rw, Source{LSN: uint64(i + 1)})
		cancel()
		if err != nil {
			if rw.block.Holders() != 0 {
				t.Fatalf("a row not taken still holds its block (%d holders)", rw.block.Holders())
			}
			break // the cap holds the stream back
		}
		prepared++
		if topic == "stuck" {
			held++
		}
		r.Produce(p, func() {})
	}
	if limit := maxBytes/blockSize + 1; held > limit {
		t.Fatalf("took %d rows, %d of them held by a partition that does not acknowledge, each keeping a block of %d bytes alive (%d bytes) under a byte cap of %d: want at most %d held",
			prepared, held, blockSize, held*blockSize, maxBytes, limit)
	}
	if prepared == 400 {
		t.Fatal("the router never held the stream back")
	}
	if b := counters.InFlightBytes.Load(); b < int64(held-1)*blockSize {
		t.Fatalf("%d bytes in flight with %d blocks held", b, held)
	}
}

// TestBlocksAreChargedOnce: rows that share blocks charge each block once while any of their
// records is in flight, and everything is given back once all are acknowledged.
func TestBlocksAreChargedOnce(t *testing.T) {
	r, counters := chargedRouter(t)
	blocks := []*pin.Block{pin.NewBlock(32 << 10), pin.NewBlock(32 << 10), pin.NewBlock(32 << 10)}
	acked := make(chan struct{}, 90)
	var own int64
	var ps []*Prepared
	for i := range 90 {
		p, err := r.Prepare(context.Background(), blockedRow{row("orders", fmt.Sprint("e", i)), blocks[i/30]}, Source{LSN: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		own += p.size
		ps = append(ps, p)
	}
	if b := counters.InFlightBytes.Load(); b != own+3*(32<<10) {
		t.Fatalf("%d bytes in flight, want the records' %d and three blocks of 32 KiB once each (%d)", b, own, own+3*(32<<10))
	}
	for _, p := range ps {
		r.Produce(p, func() { acked <- struct{}{} })
	}
	for range 90 {
		select {
		case <-acked:
		case <-time.After(10 * time.Second):
			t.Fatal("records not acknowledged")
		}
	}
	if b := counters.InFlightBytes.Load(); b != 0 {
		t.Fatalf("%d bytes in flight after every record was acknowledged", b)
	}
	for i, b := range blocks {
		if b.Holders() != 0 {
			t.Fatalf("block %d still has %d holders", i, b.Holders())
		}
	}
}

// TestBlockOfARowGivenUpIsGivenBack: a row waits for room while the other record of its block is in
// flight; that record is acknowledged, then the waiting row is given up (its context ends). The row
// was the block's last holder, so what the acknowledged record charged for the block must be given
// back, or the byte cap shrinks for good.
func TestBlockOfARowGivenUpIsGivenBack(t *testing.T) {
	r, counters := chargedRouter(t, func(o *Options) {
		o.IsolateUntil = 100 // a row of a transaction committed at or below 100 waits until it is alone
	})
	x, y := pin.NewBlock(32<<10), pin.NewBlock(32<<10)
	a, err := r.Prepare(context.Background(), blockedRow{row("orders", "a"), x}, Source{LSN: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := r.Prepare(context.Background(), blockedRow{row("orders", "c"), y}, Source{LSN: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := r.Prepare(ctx, blockedRow{row("orders", "b"), x}, Source{LSN: 3, CommitLSN: 50})
		waited <- err
	}()
	for x.Holders() != 2 { // the waiting row holds x
		time.Sleep(time.Millisecond)
	}
	acked := make(chan struct{}, 2)
	r.Produce(a, func() { acked <- struct{}{} })
	<-acked
	cancel()
	if err := <-waited; err == nil {
		t.Fatal("the row waiting to be alone was taken while another record was in flight")
	}
	r.Produce(other, func() { acked <- struct{}{} })
	<-acked
	if b := counters.InFlightBytes.Load(); b != 0 || x.Holders() != 0 || y.Holders() != 0 {
		t.Fatalf("%d bytes in flight (holders %d, %d) after every record taken was acknowledged", b, x.Holders(), y.Holders())
	}
}

// chargedRouter is a router on a one-broker kfake cluster holding the topic "orders", with room for
// 1,000 records and 64 MiB in flight, and the counters that show what is charged; opts change its
// options further.
func chargedRouter(t *testing.T, opts ...func(*Options)) (*Router, *Counters) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	counters := new(Counters)
	r := testRouter(t, c, func(o *Options) {
		o.Limits.MaxInFlightRecords, o.Limits.MaxInFlightBytes = 1000, 64<<20
		o.Counters = counters
		for _, f := range opts {
			f(o)
		}
	})
	return r, counters
}
