package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"
)

// floor is what the machine and the two servers allow at one rate: commit → decoded by a minimal
// logical-replication reader, and produce → consumed on the same broker by a raw producer.
type floor struct {
	decode, kafka *latency
}

// sum adds the two floors' quantiles: an approximation of the end-to-end floor (quantiles do not add
// exactly; the sum is at least the floor's own quantile when the two legs are independent).
func (f floor) sum() latency {
	return latency{rate: f.decode.rate, p50: f.decode.p50 + f.kafka.p50, p99: f.decode.p99 + f.kafka.p99,
		p999: f.decode.p999 + f.kafka.p999, behind: f.decode.behind || f.kafka.behind}
}

// decodeFloor writes rate events/s into the floor table while a pglogrepl reader on its own slot
// (pgoutput, the floor publication) decodes them; latency is from COMMIT sent to the Insert message's
// receipt. The reader confirms what it received, every second and whenever asked.
func (b *bench) decodeFloor(ctx context.Context, t *target, rate int) (*latency, error) {
	conn, err := pgconn.Connect(ctx, replicationURL(b.c.pgURL))
	if err != nil {
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	defer conn.Close(context.Background())
	slot := t.slot + "_floor"
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true}); err != nil {
		return nil, fmt.Errorf("create floor slot: %w", err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + t.pub + "'"}}); err != nil {
		return nil, fmt.Errorf("start floor replication: %w", err)
	}
	times, out := newCommitTimes(), newSamples()
	rctx, stopReading := context.WithCancel(ctx)
	var readErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		readErr = readFloor(rctx, conn, times, out)
	}()
	l := &latency{rate: rate}
	l.sent, l.achieved, err = b.writeLoad(ctx, t, rate, b.c.steadyRows, b.c.steadyFor, times)
	if err == nil {
		l.behind = !waitSeen(out, l.sent, 15*time.Second)
	}
	stopReading()
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if readErr != nil && !errors.Is(readErr, context.Canceled) {
		return nil, fmt.Errorf("floor reader: %w", readErr)
	}
	out.quantiles(l)
	return l, nil
}

// readFloor is the minimal reader: Insert messages' first column is the event id.
func readFloor(ctx context.Context, conn *pgconn.PgConn, times *commitTimes, out *samples) error {
	var received pglogrepl.LSN
	nextStatus := time.Now()
	status := func() error {
		nextStatus = time.Now().Add(time.Second)
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: received})
	}
	for {
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if pgconn.Timeout(err) {
			if err := status(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		now := time.Now()
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			if e, ok := msg.(*pgproto3.ErrorResponse); ok {
				return fmt.Errorf("%s", e.Message)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return err
			}
			received = max(received, ka.ServerWALEnd)
			if ka.ReplyRequested {
				if err := status(); err != nil {
					return err
				}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return err
			}
			received = max(received, xld.WALStart+pglogrepl.LSN(len(xld.WALData)))
			if len(xld.WALData) == 0 || xld.WALData[0] != 'I' {
				continue
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return err
			}
			if ins, ok := m.(*pglogrepl.InsertMessage); ok && ins.Tuple != nil && len(ins.Tuple.Columns) > 0 {
				id := string(ins.Tuple.Columns[0].Data)
				if t0, ok := times.get(id); ok {
					out.add(id, now.Sub(t0))
				}
			}
		}
		if time.Now().After(nextStatus) {
			if err := status(); err != nil {
				return err
			}
		}
	}
}

// replicationURL adds replication=database to a PostgreSQL URL.
func replicationURL(u string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "replication=database"
}

// kafkaFloor produces rate records/s (groups of k, the steady load's transaction size) with a raw
// franz-go producer (idempotent, acks=all, linger 0) to the floor topic while a consumer reads it;
// latency is from the Produce call to the consumer's receipt.
func (b *bench) kafkaFloor(ctx context.Context, topic string, rate int) (*latency, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.c.brokers, ",")...), kgo.ProducerLinger(0))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	times, out := newCommitTimes(), newSamples()
	stop, err := b.consumeLatencies(ctx, topic, false, times, out)
	if err != nil {
		return nil, err
	}
	defer stop()
	k := b.c.steadyRows
	interval := time.Duration(float64(time.Second) * float64(k) / float64(rate))
	var mu sync.Mutex
	var produceErr error
	l := &latency{rate: rate}
	start := time.Now()
	end := start.Add(b.c.steadyFor)
	ids := make([]string, k)
	for next := start; time.Now().Before(end); next = next.Add(interval) {
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
		for j := range ids {
			ids[j] = uuid()
		}
		times.set(ids, time.Now())
		for j, id := range ids {
			agg := fmt.Sprintf("order-%d", (l.sent+j)%1000)
			cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(agg),
				Value:   []byte(fmt.Sprintf(`{"order_id": %q, "seq": %d}`, agg, l.sent+j)),
				Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(id)}, {Key: "event_type", Value: []byte("OrderPlaced")}}},
				func(_ *kgo.Record, err error) {
					if err != nil {
						mu.Lock()
						produceErr = errors.Join(produceErr, err)
						mu.Unlock()
					}
				})
		}
		l.sent += k
	}
	l.achieved = perSecond(l.sent, time.Since(start))
	if err := cl.Flush(ctx); err != nil {
		return nil, err
	}
	if produceErr != nil {
		return nil, produceErr
	}
	l.behind = !waitSeen(out, l.sent, 15*time.Second)
	out.quantiles(l)
	return l, nil
}
