package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// runInbox measures package inbox (bench -inbox N): N records on a topic of 3 partitions, consumed
// side by side in each run by
//   - the inbox, with a handler that inserts one row (claim and version check in one statement, the
//     handler, a commit per batch of 50 events of a partition), the same with one transaction per
//     event (BatchSize 1), and
//   - a bare consumer that runs the same insert per record without the inbox (autocommit, no claim,
//     no version check: what a service without idempotence does),
//
// both reading with manual commits per poll and partitions in parallel. It prints events/s for each
// (medians of runs) and their ratio.
func runInbox(c config, adminURL string, n, runs int) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	id := strconv.FormatInt(time.Now().Unix(), 36)
	topic := "bench.inbox." + id
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, topic); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil && ends.Error() == nil && len(ends[topic]) == 3 {
			break // every partition's leader serves it
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: partitions not served after 30 s", topic)
		}
	}
	var mu sync.Mutex
	var produceErr error
	versions := map[string]int64{}
	for i := 0; i < n; i++ {
		agg := "order-" + strconv.Itoa(i%500)
		versions[agg]++
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(agg), Value: []byte(fmt.Sprintf(`{"amount_cents": %d}`, i)), Headers: []kgo.RecordHeader{
			{Key: "event_id", Value: []byte(fmt.Sprintf("%s-%d", id, i))}, {Key: "event_type", Value: []byte("OrderPaid")},
			{Key: "aggregate_type", Value: []byte("order")}, {Key: "aggregate_version", Value: []byte(strconv.FormatInt(versions[agg], 10))}}},
			func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					produceErr = err
					mu.Unlock()
				}
			})
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	if produceErr != nil {
		return fmt.Errorf("produce: %w", produceErr)
	}
	fmt.Printf("inbox: %d events on %s (3 partitions, 500 aggregates), %d runs\n", n, topic, runs)
	var withInbox, single, bare []float64
	for r := 0; r < runs; r++ {
		name := fmt.Sprintf("bench_inbox_%s_%d", id, r)
		if _, err := pool.Exec(ctx, "CREATE TABLE "+name+"_effects (event_id text, aggregate_id text, amount text)"); err != nil {
			return err
		}
		insert := "INSERT INTO " + name + "_effects (event_id, aggregate_id, amount) VALUES ($1, $2, $3)"
		d, err := timeInbox(ctx, pool, c, topic, name, insert, n, 0)
		if err != nil {
			return err
		}
		withInbox = append(withInbox, float64(n)/d.Seconds())
		d, err = timeInbox(ctx, pool, c, topic, name+"_single", insert, n, 1)
		if err != nil {
			return err
		}
		single = append(single, float64(n)/d.Seconds())
		d, err = timeBare(ctx, pool, c, topic, name, insert, n)
		if err != nil {
			return err
		}
		bare = append(bare, float64(n)/d.Seconds())
		fmt.Printf("  run %d: inbox %.0f events/s (one transaction per event: %.0f), bare consumer %.0f events/s\n", r+1, withInbox[r], single[r], bare[r])
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+name+"_effects, "+name+", "+name+"_versions, "+name+"_single, "+name+"_single_versions")
	}
	mi, ms, mb := median(withInbox), median(single), median(bare)
	fmt.Printf("inbox: %.0f events/s (batches of 50); %.0f events/s with one transaction per event (BatchSize 1); bare consumer (same insert, no claim, no version check, autocommit): %.0f events/s; ratios %.2f and %.2f (medians of %d)\n",
		mi, ms, mb, mi/mb, ms/mb, runs)
	return nil
}

// timeInbox consumes the topic through an Inbox (batch: its BatchSize, 0 for the default) until n
// events are applied.
func timeInbox(ctx context.Context, pool *pgxpool.Pool, c config, topic, name, insert string, n, batch int) (time.Duration, error) {
	in, err := inbox.New(inbox.Options{Consumer: name, DB: pool, BatchSize: batch, Brokers: strings.Split(c.brokers, ","), Topics: []string{topic}, Group: name + "_inbox", Table: "public." + name,
		Handler: func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			_, err := tx.Exec(ctx, insert, ev.ID, ev.AggregateID, string(ev.Payload))
			return err
		}})
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if err := in.Setup(ctx); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- in.Run(rctx) }()
	for in.Stats().Applied < int64(n) {
		select {
		case err := <-done:
			cancel()
			return 0, fmt.Errorf("inbox stopped: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	cancel()
	<-done
	return took, nil
}

// timeBare consumes the topic with the same insert per record and no inbox until n are inserted.
func timeBare(ctx context.Context, pool *pgxpool.Pool, c config, topic, name, insert string, n int) (time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...), kgo.ConsumerGroup(name+"_bare"), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	start := time.Now()
	handled := 0
	for handled < n {
		fetches := cl.PollRecords(ctx, 500)
		var mu sync.Mutex
		var firstErr error
		var last []*kgo.Record
		var wg sync.WaitGroup
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, r := range p.Records {
					if _, err := pool.Exec(ctx, insert, headerOf(r, "event_id"), string(r.Key), string(r.Value)); err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
						return
					}
				}
				mu.Lock()
				last = append(last, p.Records[len(p.Records)-1])
				handled += len(p.Records)
				mu.Unlock()
			}()
		})
		wg.Wait()
		if firstErr != nil {
			return 0, firstErr
		}
		if err := cl.CommitRecords(ctx, last...); err != nil {
			return 0, err
		}
		cl.AllowRebalance()
	}
	return time.Since(start), nil
}

func headerOf(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
