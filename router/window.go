package router

import "time"

// The in-flight window's sizing (see windowSizer).
const (
	// windowPeriod is how often the window is sized again, from the acknowledgements of the period.
	windowPeriod = 100 * time.Millisecond
	// windowMinAcks is how many acknowledgements a period needs for its latency to count.
	windowMinAcks = 20
	// baseLifetime is how long the base latency stands before the window is halved to measure it
	// again (it can only fall otherwise, and a base measured while records queued would let the
	// window grow to the cap).
	baseLifetime = 10 * time.Second
	// DefaultMinInFlightRecords is the smallest the window gets (limits.min_inflight_records).
	DefaultMinInFlightRecords = 2000
)

// windowSizer sizes the window of records in flight by the latency of their acknowledgements, the
// way TCP Vegas sizes a congestion window. While the window is what holds the stream back (the
// stream waited for room in a period), a larger window either brings more throughput at the same
// latency (the way to Kafka has room: a broker 20 ms away needs many records in flight to be busy)
// or only longer queues, which show as latency: the window grows by half while the mean
// acknowledgement latency stays within twice the lowest seen at a limiting window (the base), and
// shrinks by a quarter above it. It settles between about one and three times what the way to Kafka
// holds, and never leaves [min, max] (max is limits.max_inflight_records, the bound of memory).
// Every baseLifetime the window is halved and the base measured again, so that a base taken while
// records queued does not hold the window high. While the stream does not wait for room, the
// window stays as it is: an unused window costs no memory.
//
// A windowSizer is not safe for concurrent use (the limiter's lock guards it).
type windowSizer struct {
	min, max int64
	window   int64

	start  time.Time     // of the current period
	acks   int64         // in the current period
	latSum time.Duration // of the current period's acknowledgements
	waited bool          // the stream waited for room in the current period
	settle bool          // the window changed when the period began: its latencies are the old window's

	base   time.Duration // the lowest mean latency of a limiting period; 0: none yet
	baseAt time.Time
}

func newWindowSizer(minRecords, maxRecords int64) *windowSizer {
	minRecords = max(min(minRecords, maxRecords), 1)
	return &windowSizer{min: minRecords, max: maxRecords, window: minRecords}
}

// acked records an acknowledgement at now of a record handed over took earlier; it returns true
// when the window changed.
func (w *windowSizer) acked(now time.Time, took time.Duration) bool {
	changed := w.roll(now)
	w.acks++
	w.latSum += took
	return changed
}

// wait records that the stream waits for room at now; it returns true when the window changed.
func (w *windowSizer) wait(now time.Time) bool {
	changed := w.roll(now)
	w.waited = true
	return changed
}

// roll ends the period when it is over and sizes the window from it; it returns true when the
// window changed.
func (w *windowSizer) roll(now time.Time) bool {
	if w.start.IsZero() {
		w.start = now
		return false
	}
	if now.Sub(w.start) < windowPeriod {
		return false
	}
	old := w.window
	if w.settle {
		w.settle = false
	} else if w.waited && w.acks >= windowMinAcks {
		avg := w.latSum / time.Duration(w.acks)
		switch {
		case w.base == 0 || avg < w.base:
			w.base, w.baseAt = avg, now
			w.window = w.grown()
		case now.Sub(w.baseAt) > baseLifetime:
			w.base = 0
			w.window = max(w.min, w.window/2)
		case avg > 2*w.base:
			w.window = max(w.min, w.window*3/4)
		default:
			w.window = w.grown()
		}
	}
	w.start, w.acks, w.latSum, w.waited = now, 0, 0, false
	w.settle = w.window != old
	return w.settle
}

func (w *windowSizer) grown() int64 { return min(w.max, w.window+max(w.window/2, 1)) }
