package main

import (
	"math"
	"testing"
)

func TestQuantileSince(t *testing.T) {
	before := histogram{bounds: []float64{0.001, 0.002, 0.004}, counts: []uint64{10, 10, 10}, total: 10}
	tests := []struct {
		name   string
		after  histogram
		q      float64
		bound  float64
		counts uint64
	}{
		{"nothing new", before, 0.99, 0, 0},
		{"all new ones in the first bucket", histogram{bounds: before.bounds, counts: []uint64{110, 110, 110}, total: 110}, 0.99, 0.001, 100},
		// 100 new: 98 at most 1 ms, 1 at most 2 ms, 1 at most 4 ms: p99 is the 99th, in the 2 ms bucket.
		{"the tail in a later bucket", histogram{bounds: before.bounds, counts: []uint64{108, 109, 110}, total: 110}, 0.99, 0.002, 100},
		{"p50 stays low", histogram{bounds: before.bounds, counts: []uint64{108, 109, 110}, total: 110}, 0.5, 0.001, 100},
		{"past the last bound", histogram{bounds: before.bounds, counts: []uint64{60, 60, 60}, total: 110}, 0.99, math.Inf(1), 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bound, n := tt.after.quantileSince(before, tt.q)
			if bound != tt.bound || n != tt.counts {
				t.Fatalf("quantileSince(%v) = %v, %d; want %v, %d", tt.q, bound, n, tt.bound, tt.counts)
			}
		})
	}
}
