package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// testConfig is the pipeline configuration for a fixture, with short intervals for tests.
func testConfig(f *testenv.Fixture) config.Config { return testenv.RouterConfig(f) }

// testLogger logs to the test output when -v is given and otherwise keeps the log's last lines,
// which it prints if the test fails: a pipeline that never reached streaming says why.
func testLogger(t testing.TB) *slog.Logger { return testLoggerTo(t, io.Discard) }

// testLoggerTo logs to w, and to the test output with -v; without -v it keeps the last lines and
// prints them if the test fails.
func testLoggerTo(t testing.TB, w io.Writer) *slog.Logger {
	if testing.Verbose() {
		w = io.MultiWriter(w, os.Stderr)
	} else {
		tail := &logTail{}
		w = io.MultiWriter(w, tail)
		t.Cleanup(func() { // after the pipeline's own cleanups (registered later): its last words too
			if last := tail.String(); t.Failed() && last != "" {
				t.Logf("the log of %s (last %d KB; -v prints all of it):\n%s", t.Name(), logTailBytes>>10, last)
			}
		})
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// logTailBytes is about how much of a test's log logTail keeps.
const logTailBytes = 64 << 10

// logTail keeps about the last logTailBytes of what is written to it. Safe for concurrent use: the
// pipeline's goroutines may still log after the test has ended.
type logTail struct {
	mu  sync.Mutex
	buf []byte
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if len(l.buf) > 2*logTailBytes {
		l.buf = append(l.buf[:0], l.buf[len(l.buf)-logTailBytes:]...)
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > logTailBytes {
		return string(l.buf[len(l.buf)-logTailBytes:])
	}
	return string(l.buf)
}

// running is a pipeline running in the background of a test.
type running struct {
	p    *Pipeline
	stop func() error
}

// startPipeline runs a pipeline until the test stops it or ends.
func startPipeline(t *testing.T, cfg config.Config) *running {
	t.Helper()
	return startPipelineLogged(t, cfg, testLogger(t))
}

// startPipelineLogged is startPipeline logging to log.
func startPipelineLogged(t *testing.T, cfg config.Config, log *slog.Logger) *running {
	t.Helper()
	run := launch(t, cfg, log)
	testenv.WaitFor(t, 60*time.Second, "pipeline streaming", func() bool { return run.p.State() == StateStreaming })
	return run
}

// launch starts a pipeline of cfg in the background, stopped when the test ends; it waits for
// nothing.
func launch(t *testing.T, cfg config.Config, log *slog.Logger) *running {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	p, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	var result error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(60 * time.Second):
				result = errors.New("pipeline did not stop within 60 s")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return &running{p: p, stop: stop}
}
