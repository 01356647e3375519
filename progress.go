package main

import (
	"fmt"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressReporter shows snapshot progress: a bar with rate and ETA on a terminal, a plain line every
// 10 seconds otherwise.
func progressReporter(terminal bool) func(done, total int64) {
	if terminal {
		var bar *progressbar.ProgressBar
		return func(done, total int64) {
			if bar == nil {
				bar = progressbar.NewOptions64(total, progressbar.OptionSetDescription("snapshot"),
					progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowCount(), progressbar.OptionShowIts(),
					progressbar.OptionSetItsString("rows"), progressbar.OptionThrottle(200*time.Millisecond),
					progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }))
			}
			_ = bar.Set64(done)
		}
	}
	var last time.Time
	start := time.Now()
	return func(done, total int64) {
		if time.Since(last) < 10*time.Second && done < total {
			return
		}
		last = time.Now()
		rate := float64(done) / max(time.Since(start).Seconds(), 0.001)
		eta := "-"
		if rate > 0 && total >= done {
			eta = (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String()
		}
		fmt.Fprintf(os.Stderr, "snapshot: %d of %d rows acknowledged (%.0f rows/s, eta %s)\n", done, total, rate, eta)
	}
}
