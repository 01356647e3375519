package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// testConfig is the pipeline configuration for a fixture, with short intervals for tests.
func testConfig(f *testenv.Fixture) config.Config { return testenv.RouterConfig(f) }

// testLogger logs to the test output when -v is given and stays quiet otherwise.
func testLogger(t testing.TB) *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// testLoggerTo logs to w (and to the test output with -v).
func testLoggerTo(t testing.TB, w io.Writer) *slog.Logger {
	if testing.Verbose() {
		w = io.MultiWriter(w, os.Stderr)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
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
	testenv.WaitFor(t, 60*time.Second, "pipeline streaming", func() bool { return p.State() == StateStreaming })
	return &running{p: p, stop: stop}
}
