package main

import (
	"context"
	"fmt"
	"time"
)

// sweepPoint is one drain of outbox-cdc (at-least-once) over a backlog of one payload size and
// transaction size.
type sweepPoint struct {
	payload, txRows, events int
	bytes                   int64
	drain                   time.Duration // first record to last
	cpu                     time.Duration // the router's CPU for the whole drain, start-up included
	peakRSSKB               int64
}

func (p sweepPoint) eventsPerSec() float64 { return perSecond(p.events, p.drain) }
func (p sweepPoint) mbPerSec() float64     { return float64(p.bytes) / p.drain.Seconds() / 1e6 }
func (p sweepPoint) cpuPerEvent() float64 {
	return float64(p.cpu.Microseconds()) / float64(max(p.events, 1))
}

// sweepBytes caps a sweep point's backlog: large payloads get fewer events.
const sweepBytes = 192 << 20

// sweeps drains backlogs of each -payloads size (transactions of -tx-rows) and each -tx-sizes size
// (payload -payload) through outbox-cdc.
func (b *bench) sweeps(ctx context.Context) (out struct{ payload, tx []sweepPoint }, err error) {
	for _, p := range b.c.payloads {
		pt, err := b.sweepPoint(ctx, p, b.c.txRows)
		if err != nil {
			return out, fmt.Errorf("payload %d B: %w", p, err)
		}
		out.payload = append(out.payload, pt)
	}
	for _, k := range b.c.txSizes {
		pt, err := b.sweepPoint(ctx, b.c.payload, k)
		if err != nil {
			return out, fmt.Errorf("transactions of %d rows: %w", k, err)
		}
		out.tx = append(out.tx, pt)
	}
	return out, nil
}

func (b *bench) sweepPoint(ctx context.Context, payload, txRows int) (sweepPoint, error) {
	n := min(b.c.sweepEvents, max(sweepBytes/payload, 1000))
	t := b.newTarget(fmt.Sprintf("sweep p%d k%d", payload, txRows))
	defer b.cleanup(t)
	if err := b.setup(ctx, t); err != nil {
		return sweepPoint{}, err
	}
	records := makeRecords(n, payload)
	if err := b.writeBacklog(ctx, t, records, txRows); err != nil {
		return sweepPoint{}, err
	}
	cmd, err := b.startRouter(t)
	if err != nil {
		return sweepPoint{}, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	m := &measured{}
	if err := b.drain(ctx, cmd.Process.Pid, t, n, m); err != nil {
		return sweepPoint{}, err
	}
	return sweepPoint{payload: payload, txRows: txRows, events: n, bytes: recordBytes(records),
		drain: m.drain - m.firstRecord, cpu: cpuTime(cmd.Process.Pid), peakRSSKB: max(m.peakRSSKB, peakRSS(cmd.Process.Pid))}, nil
}
