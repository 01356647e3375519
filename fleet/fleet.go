// Package fleet runs the pipelines of several sources (the sources list) in one process, and shares
// them between instances. Each source streams independently: one that fails for good — a
// configuration its database refuses, a lost slot — is held with its error and retried later while
// the others stream on. With a Coordinator, a source runs only while this instance is assigned it
// (a Kafka consumer group spreads the sources over the live instances); PostgreSQL's slot
// exclusivity stays the safety net: two instances never stream one slot, whatever the group says.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// Retry bounds of a source whose pipeline stopped on an error that heals without touching the stream
// (heals: the database missing or refusing the role): it is started again after FailedRetryMin,
// doubling up to FailedRetryMax, as a crash-looping pod would be, but without stopping
// the other sources.
const (
	FailedRetryMin = 15 * time.Second
	FailedRetryMax = 5 * time.Minute
)

// Watcher learns of each source's health (the metrics and health endpoints).
type Watcher interface {
	// Watch adds or replaces a source's health.
	Watch(name string, health func() pipeline.Health)
	// Unwatch removes a source this instance no longer streams.
	Unwatch(name string)
}

// Source is one source of the fleet: its configuration and the pipeline options of its own (its
// metrics observer, the tracer).
type Source struct {
	Config  config.Config
	Options []pipeline.Option
}

// Scrub hides secrets in text shown to people (the failed source's error in its health).
type Scrub func(string) string

// Fleet runs many sources' pipelines in one process. Create it with New and call Run once.
type Fleet struct {
	log     *slog.Logger
	watcher Watcher
	sources []*managedSource
	coord   *Coordinator
	ctx     context.Context // Run's, which the pipelines run under
	// scrubber hides secrets in what the API shows; name is this instance's name without coordination.
	scrubber Scrub
	name     string
	// fail, with ExitOnFailure, ends Run with a source's permanent error.
	fail context.CancelCauseFunc
}

// sourceFailed is the cause with which a source's permanent error ends Run (ExitOnFailure).
type sourceFailed struct{ err error }

func (s *sourceFailed) Error() string { return s.err.Error() }

// managedSource is one configured source's state in the fleet, whether its pipeline runs or not
// (paused, held back, assigned elsewhere).
type managedSource struct {
	src   Source
	log   *slog.Logger
	scrub Scrub

	mu        sync.Mutex
	p         *pipeline.Pipeline
	failed    error     // the permanent error the last pipeline stopped on, nil while it runs
	retryAt   time.Time // when a failed source starts again
	failures  int
	lastStart time.Time
	cancel    context.CancelFunc // nil while the source is not started
	done      chan struct{}
	// watching is the slot monitor of a source paused while assigned here (nil otherwise): its lag
	// and WAL status stay in the metrics while nothing streams it.
	watching *watcher
	assigned bool  // the coordination gave it to this instance (always, without one)
	pause    Pause // the operator's pause state (fleet-wide)
	// change serializes starts and stops of this source (a stop waits for the pipeline).
	change sync.Mutex
	// exit, when set (ExitOnFailure), ends the fleet's Run with the source's permanent error instead of
	// holding the source.
	exit func(error)
	// release, with a coordination, steps this instance back from the source for a while, so that
	// another instance may take it (a cause local to this instance: its configuration).
	release func(time.Duration)
}

// New checks every source's pipeline configuration (routing rules) so that a mistake is refused at
// start, naming the source, and returns the fleet. With coord, sources run only while coord assigns
// them to this instance; without, every source runs.
func New(log *slog.Logger, w Watcher, scrub Scrub, coord *Coordinator, sources []Source) (*Fleet, error) {
	host, _ := os.Hostname()
	f := &Fleet{log: log, watcher: w, coord: coord, scrubber: scrub, name: host}
	var errs []error
	for _, s := range sources {
		r := &managedSource{src: s, log: log.With("source", s.Config.Name), scrub: scrub}
		if _, err := pipeline.New(s.Config, r.log, s.Options...); err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s.Config.Name, err))
			continue
		}
		f.sources = append(f.sources, r)
		if coord != nil {
			name := s.Config.Name
			r.release = func(d time.Duration) { coord.Release(name, d) }
		}
		if coord == nil && w != nil {
			// Without coordination every source is this instance's from the start: /readyz says
			// "starting" for each until it streams, never "no source".
			r.assigned = true
			w.Watch(s.Config.Name, r.health)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return f, nil
}

// ExitOnFailure makes Run return the first permanent error a source stops on, stopping the others,
// instead of holding that source and retrying it: run's one-source form, whose process exits so that
// its supervisor sees the failure, as it always has. Call it before Run.
func (f *Fleet) ExitOnFailure() {
	for _, r := range f.sources {
		r.exit = func(err error) { f.fail(&sourceFailed{err}) }
	}
}

// Run streams the sources until ctx ends — every one, or those the coordinator assigns to this
// instance as they come and go — then stops each gracefully and returns nil. It returns an error
// only when the coordination cannot start, or, with ExitOnFailure, when a source stopped for good.
func (f *Fleet) Run(ctx context.Context) error {
	defer f.stopAll()
	ctx, f.fail = context.WithCancelCause(ctx)
	defer f.fail(nil)
	if f.coord == nil {
		f.ctx = ctx
		for _, r := range f.sources {
			f.Assigned(r.src.Config.Name, true)
		}
		<-ctx.Done()
		var failed *sourceFailed
		if errors.As(context.Cause(ctx), &failed) {
			return failed.err
		}
		return nil
	}
	members := make([]Member, len(f.sources))
	for i, r := range f.sources {
		members[i] = Member{Name: r.src.Config.Name, Identity: r.src.Config.SourceIdentity()}
	}
	f.ctx = ctx
	return f.coord.Run(ctx, members, f)
}

// Assigned implements Events: the source is this instance's, or no longer.
func (f *Fleet) Assigned(name string, assigned bool) {
	if r := f.source(name); r != nil {
		r.mu.Lock()
		r.assigned = assigned
		r.mu.Unlock()
		f.reconcile(r)
	}
}

// Paused implements Events: an operator paused or resumed the source.
func (f *Fleet) Paused(name string, p Pause) {
	if r := f.source(name); r != nil {
		r.mu.Lock()
		changed := r.pause.Paused != p.Paused
		r.pause = p
		r.mu.Unlock()
		if changed {
			if p.Paused {
				r.log.Info("source paused: stopping it and releasing its slot", "by", p.By)
			} else {
				r.log.Info("source resumed", "by", p.By)
			}
		}
		f.reconcile(r)
	}
}

// source returns the source named name, or nil.
func (f *Fleet) source(name string) *managedSource {
	for _, r := range f.sources {
		if r.src.Config.Name == name {
			return r
		}
	}
	return nil
}

// reconcile starts or stops the source to match what it should be: running while assigned here and
// not paused; watched (on the metrics and health endpoints) while assigned here.
func (f *Fleet) reconcile(r *managedSource) {
	r.change.Lock()
	defer r.change.Unlock()
	r.mu.Lock()
	assigned, paused := r.assigned, r.pause.Paused
	r.mu.Unlock()
	if assigned && !paused {
		r.unwatch()
		f.start(f.ctx, r)
	} else {
		f.stop(r)
		if assigned {
			r.watch(f.ctx)
		} else {
			r.unwatch()
		}
	}
	if f.watcher != nil {
		if assigned {
			f.watcher.Watch(r.src.Config.Name, r.health)
		} else {
			f.watcher.Unwatch(r.src.Config.Name)
		}
	}
}

// start runs the source's pipeline in the background (no-op when it runs).
func (f *Fleet) start(ctx context.Context, r *managedSource) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return
	}
	p, err := pipeline.New(r.src.Config, r.log, r.src.Options...)
	if err != nil { // checked by New; cannot fail now
		r.log.Error("source cannot start", "error", err.Error())
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	r.p, r.failed, r.cancel, r.done = p, nil, cancel, make(chan struct{})
	done := r.done
	go func() {
		defer close(done)
		r.run(sctx)
	}()
	if f.coord != nil {
		r.log.Info("source assigned to this instance: starting it")
	}
}

// stop stops the source's pipeline gracefully and waits for it (no-op when it does not run).
func (f *Fleet) stop(r *managedSource) {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.cancel = nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	if f.coord != nil {
		r.log.Info("source stopped on this instance, its slot released")
	}
}

// stopAll stops every running source, all at once.
func (f *Fleet) stopAll() {
	var wg sync.WaitGroup
	for _, r := range f.sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.change.Lock()
			defer r.change.Unlock()
			f.stop(r)
			r.unwatch()
		}()
	}
	wg.Wait()
}

// watcher is the slot monitor of a paused source (pipeline.Watch).
type watcher struct {
	p      *pipeline.Pipeline
	cancel context.CancelFunc
	done   chan struct{}
}

// watch starts watching the paused source's slot (no-op while it is watched).
func (r *managedSource) watch(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching != nil {
		return
	}
	p, err := pipeline.New(r.src.Config, r.log, r.src.Options...)
	if err != nil { // checked by New; cannot fail now
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &watcher{p: p, cancel: cancel, done: make(chan struct{})}
	r.watching = w
	go func() {
		defer close(w.done)
		p.Watch(wctx)
	}()
}

// unwatch stops watching the source's slot (no-op when it is not watched).
func (r *managedSource) unwatch() {
	r.mu.Lock()
	w := r.watching
	r.watching = nil
	r.mu.Unlock()
	if w != nil {
		w.cancel()
		<-w.done
	}
}

// run runs one source's pipeline until ctx ends, starting a new one after a permanent failure.
func (r *managedSource) run(ctx context.Context) {
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
		if r.exit != nil {
			r.exit(err)
			return
		}
		if !heals(err) && !local(err) {
			// A row, the outbox or the slot needs the operator: starting again would replay up to the
			// same stop, again and again. Held until the process is restarted.
			r.mu.Lock()
			r.failed, r.retryAt = err, time.Time{}
			r.mu.Unlock()
			r.log.Error("source stopped: retrying cannot fix this; the other sources go on, and this one is held until it is fixed and the process restarted",
				"error", err.Error())
			<-ctx.Done()
			return
		}
		r.mu.Lock()
		if time.Since(r.lastStart) > 2*FailedRetryMax {
			r.failures = 0 // it ran a good while: a new failure, not the same one again
		}
		wait := min(FailedRetryMin<<min(r.failures, 8), FailedRetryMax)
		r.failures++
		r.failed, r.retryAt = err, time.Now().Add(wait)
		r.mu.Unlock()
		r.log.Error("source stopped: retrying cannot fix this until it is fixed; the other sources go on, and this one starts again after the wait",
			"error", err.Error(), "retry_in", wait.String())
		if local(err) && r.release != nil {
			// This instance's configuration is the cause: another instance's may not be.
			go r.release(wait)
		}
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
func (r *managedSource) health() pipeline.Health {
	r.mu.Lock()
	p, failed, retryAt, pause, running, w := r.p, r.failed, r.retryAt, r.pause, r.cancel != nil, r.watching
	r.mu.Unlock()
	h := pipeline.Health{State: pipeline.StateStopped, NotReady: "stopped"}
	if p != nil {
		h = p.Health()
	}
	if pause.Paused && !running {
		if w != nil {
			h = w.p.Health() // the slot as its monitor reads it while paused
		}
		h.Paused, h.PausedSince, h.Ready, h.StandbyReady = true, pause.At, false, false
		slot := "its slot released"
		switch {
		case h.SlotKnown && !h.Slot.Exists:
			slot = "its slot is gone: recover with `outbox-cdc resync`"
		case h.SlotKnown && h.Slot.WALStatus == "lost":
			slot = "its slot is lost (WAL it needed was removed): recover with `outbox-cdc resync`"
		case h.SlotKnown:
			slot = fmt.Sprintf("its slot released, %d bytes of WAL behind", h.Slot.LagBytes)
		}
		h.NotReady = r.scrub(fmt.Sprintf("paused by %s at %s: stopped, %s; resume it to stream", orUnknown(pause.By), pause.At.UTC().Format(time.RFC3339), slot))
		return h
	}
	if failed != nil {
		h.Ready, h.StandbyReady = false, false
		again := "held: fix it, then restart the process"
		if !retryAt.IsZero() {
			again = "started again in " + max(time.Until(retryAt), 0).Round(time.Second).String()
		}
		h.NotReady = r.scrub(fmt.Sprintf("failed: %v (%s)", failed, again))
	}
	return h
}

func orUnknown(s string) string {
	if s == "" {
		return "an operator"
	}
	return s
}

// local reports a permanent error whose cause is this instance's own configuration — the
// publication carries a table this instance does not list (a rolling update that added it) — which
// another instance of the fleet may not share: the source is offered to the others meanwhile, and
// tried again here after the wait.
func local(err error) bool {
	return errors.Is(err, replication.ErrUnlistedTable)
}

// heals reports a permanent error of a source that may go away without the operator touching the
// stream — the database missing, or refusing the role (created or granted later), or lacking what
// init or an administrator provides (replication.ErrPending: the outbox table, the publication or a
// table's place in it, the slot, a privilege) — and that nothing was replayed for: such a source is
// started again after a wait. Every other one is held.
func heals(err error) bool {
	return errors.Is(err, replication.ErrPending) || replication.Refused(err)
}
