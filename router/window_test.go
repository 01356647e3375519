package router

import (
	"math/rand/v2"
	"testing"
	"time"
)

// simulate runs a model of the router in front of Kafka for d, 1 ms a step: a source that offers
// up to srcRate records/s, the window of w, and a Kafka that takes at most capRate records/s (what
// it cannot take yet queues in the client, in order) and acknowledges each record rtt+linger after
// it took it. It returns the acknowledged throughput of the last second and the window then.
func simulate(w *windowSizer, srcRate, capRate float64, rtt, linger, d time.Duration) (float64, int64) {
	const step = time.Millisecond
	now := time.Unix(0, 0)
	type batch struct {
		n           int64
		handed, due time.Time
	}
	var (
		queue, wire   []batch // handed over and waiting for Kafka; taken by Kafka
		inFlight      int64
		offered, room float64
		lastSecond    int64
	)
	for t := time.Duration(0); t < d; t += step {
		now = now.Add(step)
		for len(wire) > 0 && !wire[0].due.After(now) {
			b := wire[0]
			wire = wire[1:]
			inFlight -= b.n
			for i := int64(0); i < b.n; i++ {
				w.acked(now, now.Sub(b.handed))
			}
			if t >= d-time.Second {
				lastSecond += b.n
			}
		}
		offered = min(offered+srcRate*step.Seconds(), srcRate) // the source's backlog, at most 1 s of it
		if n := min(int64(offered), w.window-inFlight); n > 0 {
			offered -= float64(n)
			inFlight += n
			queue = append(queue, batch{n: n, handed: now})
		}
		if offered >= 1 && inFlight >= w.window {
			w.wait(now)
		}
		room = min(room+capRate*step.Seconds(), capRate*step.Seconds()*2)
		for len(queue) > 0 && room >= 1 {
			n := min(queue[0].n, int64(room))
			room -= float64(n)
			wire = append(wire, batch{n: n, handed: queue[0].handed, due: now.Add(rtt + linger)})
			if queue[0].n -= n; queue[0].n == 0 {
				queue = queue[1:]
			}
		}
	}
	return float64(lastSecond), w.window
}

// TestWindowFollowsWhatKafkaNeeds checks the adaptive in-flight window against a model of Kafka:
// it grows while a larger window brings more throughput, stops within three times what the way to
// Kafka holds when it only brings queues, never leaves [min, max], and does not grow when the
// source is slow.
func TestWindowFollowsWhatKafkaNeeds(t *testing.T) {
	const minW, maxW = 2000, 20000
	for _, tc := range []struct {
		name               string
		src, capacity      float64
		rtt, linger        time.Duration
		wantRate           float64 // the least acceptable throughput in the last second
		wantMinW, wantMaxW int64
	}{
		// A local broker, Kafka the limit: 150,000/s x 11 ms = 1,650 records fill the way.
		{"local broker, drain", 1e6, 150000, time.Millisecond, 10 * time.Millisecond, 0.95 * 150000, minW, 2 * minW},
		// 20 ms away: 150,000/s x 31 ms = 4,650 records; the window must cover them.
		{"broker 20 ms away, drain", 1e6, 150000, 20 * time.Millisecond, 10 * time.Millisecond, 0.95 * 150000, 4650, 3 * 4650},
		// 60 ms away: 14,000 records.
		{"broker 60 ms away, drain", 1e6, 200000, 60 * time.Millisecond, 10 * time.Millisecond, 0.9 * 200000, 14000, maxW},
		// Farther than the cap covers: the cap holds, the throughput is what it allows.
		{"broker 200 ms away", 1e6, 150000, 200 * time.Millisecond, 10 * time.Millisecond, 0.9 * maxW / 0.21, maxW, maxW},
		// A steady source below Kafka's capacity: the window is not what holds it back.
		{"steady 10,000/s", 10000, 150000, time.Millisecond, 10 * time.Millisecond, 0.95 * 10000, minW, minW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindowSizer(minW, maxW)
			rate, win := simulate(w, tc.src, tc.capacity, tc.rtt, tc.linger, 30*time.Second)
			t.Logf("throughput %.0f/s, window %d", rate, win)
			if rate < tc.wantRate {
				t.Errorf("throughput %.0f/s in the last second, want at least %.0f (window %d)", rate, tc.wantRate, win)
			}
			if win > tc.wantMaxW || win < tc.wantMinW {
				t.Errorf("window %d, want %d..%d", win, tc.wantMinW, tc.wantMaxW)
			}
		})
	}
}

// TestWindowStaysWithinItsBounds feeds random acknowledgements and round trips (bursts, idle
// gaps, absurd round trips) and checks that the window never leaves [min, max].
func TestWindowStaysWithinItsBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		minW := int64(1 + rng.IntN(5000))
		maxW := minW + int64(rng.IntN(50000))
		w := newWindowSizer(minW, maxW)
		now := time.Unix(0, 0)
		for j := 0; j < 20000; j++ {
			now = now.Add(time.Duration(rng.ExpFloat64() * float64(2*time.Millisecond)))
			if rng.IntN(4) == 0 {
				w.wait(now)
			} else {
				w.acked(now, time.Duration(rng.Int64N(int64(2*time.Second))))
			}
			if w.window < minW || w.window > maxW {
				t.Fatalf("window %d outside [%d, %d] after %d steps", w.window, minW, maxW, j)
			}
		}
	}
}

// TestLimiterWindowCapsRecords checks that the limiter admits no more records than its window, and
// that a fixed window (min at max) is the cap.
func TestLimiterWindowCapsRecords(t *testing.T) {
	for _, tc := range []struct{ min, max, want int }{{100, 1000, 100}, {1000, 1000, 1000}, {5000, 1000, 1000}, {0, 7, 7}} {
		l := newLimiter(tc.min, tc.max, 1<<30, nil)
		for i := 0; i < tc.want; i++ {
			if !l.take(1, false) {
				t.Fatalf("min %d max %d: record %d refused, want %d admitted", tc.min, tc.max, i+1, tc.want)
			}
		}
		if l.take(1, false) {
			t.Fatalf("min %d max %d: record %d admitted, want the window (%d) to hold", tc.min, tc.max, tc.want+1, tc.want)
		}
	}
}
