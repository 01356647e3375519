package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// histogram is a cumulative Prometheus histogram as a router's /metrics showed it at one moment,
// summed over its label sets: bucket upper bounds (seconds) in increasing order, the count of
// observations at or below each, and the count of all (the +Inf bucket).
type histogram struct {
	bounds []float64
	counts []uint64
	total  uint64
}

// scrapeHistogram reads the histogram name from the /metrics of the router serving at addr.
func scrapeHistogram(ctx context.Context, addr, name string) (histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return histogram{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return histogram{}, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return histogram{}, fmt.Errorf("parse the metrics of %s: %w", addr, err)
	}
	var h histogram
	fam, ok := families[name]
	if !ok {
		return h, nil // no observation yet
	}
	byBound := map[float64]uint64{}
	for _, m := range fam.GetMetric() {
		hist := m.GetHistogram()
		h.total += hist.GetSampleCount()
		for _, b := range hist.GetBucket() {
			byBound[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	for b := range byBound {
		h.bounds = append(h.bounds, b)
	}
	sort.Float64s(h.bounds)
	for _, b := range h.bounds {
		h.counts = append(h.counts, byBound[b])
	}
	return h, nil
}

// quantileSince is the upper bound of the bucket that holds quantile q of the observations made
// between before and h (+Inf when it lies past the last bound), and how many there were. A bucket's
// bound is all a histogram knows: the quantile is at most the bound and above the bucket before.
func (h histogram) quantileSince(before histogram, q float64) (bound float64, n uint64) {
	n = h.total - before.total
	if n == 0 {
		return 0, 0
	}
	prev := map[float64]uint64{}
	for i, b := range before.bounds {
		prev[b] = before.counts[i]
	}
	rank := uint64(math.Ceil(q * float64(n)))
	for i, b := range h.bounds {
		if h.counts[i]-prev[b] >= rank {
			return b, n
		}
	}
	return math.Inf(1), n
}
