// Package fleet runs the pipelines of several sources (the sources list) in one process: each source
// streams independently, and one that fails for good — a configuration its database refuses, a lost
// slot — is held with its error and retried later while the others stream on.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// Retry bounds of a source whose pipeline stopped on a permanent error: it is started again after
// FailedRetryMin, doubling up to FailedRetryMax, as a crash-looping pod would be, but without stopping
// the other sources.
const (
	FailedRetryMin = 15 * time.Second
	FailedRetryMax = 5 * time.Minute
)

// Watcher learns of each source's health (the metrics and health endpoints).
type Watcher interface {
	// Watch adds or replaces a source's health.
	Watch(name string, health func() pipeline.Health)
}

// Source is one source of the fleet: its configuration and the pipeline options of its own (its
// metrics observer, the tracer).
type Source struct {
	Config  config.Config
	Options []pipeline.Option
}

// Fleet runs many sources' pipelines in one process. Create it with New and call Run once.
type Fleet struct {
	log     *slog.Logger
	watcher Watcher
	sources []*running
}

// Scrub hides secrets in text shown to people (the failed source's error in its health).
type Scrub func(string) string

// running is one source's state in the fleet.
type running struct {
	src   Source
	log   *slog.Logger
	scrub Scrub

	mu        sync.Mutex
	p         *pipeline.Pipeline
	failed    error     // the permanent error the last pipeline stopped on, nil while it runs
	retryAt   time.Time // when a failed source starts again
	failures  int
	lastStart time.Time
}

// New checks every source's pipeline configuration (routing rules) so that a mistake is refused at
// start, naming the source, and returns the fleet.
func New(log *slog.Logger, w Watcher, scrub Scrub, sources []Source) (*Fleet, error) {
	f := &Fleet{log: log, watcher: w}
	var errs []error
	for _, s := range sources {
		r := &running{src: s, log: log.With("source", s.Config.Name), scrub: scrub}
		p, err := pipeline.New(s.Config, r.log, s.Options...)
		if err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s.Config.Name, err))
			continue
		}
		r.p = p
		f.sources = append(f.sources, r)
		if w != nil {
			w.Watch(s.Config.Name, r.health)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return f, nil
}

// Run streams every source until ctx ends, then stops each gracefully and returns nil.
func (f *Fleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, r := range f.sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// run runs one source's pipeline until ctx ends, starting a new one after a permanent failure.
func (r *running) run(ctx context.Context) {
	for {
		r.mu.Lock()
		p := r.p
		r.lastStart = time.Now()
		r.mu.Unlock()
		err := p.Run(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the pipeline stopped without an error")
		}
		r.mu.Lock()
		if time.Since(r.lastStart) > 2*FailedRetryMax {
			r.failures = 0 // it ran a good while: a new failure, not the same one again
		}
		wait := FailedRetryMin << min(r.failures, 8)
		wait = min(wait, FailedRetryMax)
		r.failures++
		r.failed, r.retryAt = err, time.Now().Add(wait)
		r.mu.Unlock()
		r.log.Error("source stopped: retrying cannot fix this until it is fixed; the other sources go on, and this one starts again after the wait",
			"error", err.Error(), "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		next, err := pipeline.New(r.src.Config, r.log, r.src.Options...)
		if err != nil { // checked at start; cannot fail now
			r.log.Error("source cannot start again", "error", err.Error())
			return
		}
		r.mu.Lock()
		r.p, r.failed = next, nil
		r.mu.Unlock()
	}
}

// health is the source's current pipeline's health; while it is held after a permanent failure,
// it is not ready and says why and until when.
func (r *running) health() pipeline.Health {
	r.mu.Lock()
	p, failed, retryAt := r.p, r.failed, r.retryAt
	r.mu.Unlock()
	h := p.Health()
	if failed != nil {
		h.Ready, h.StandbyReady = false, false
		h.NotReady = r.scrub(fmt.Sprintf("failed: %v (started again in %s)", failed, max(time.Until(retryAt), 0).Round(time.Second)))
	}
	return h
}
