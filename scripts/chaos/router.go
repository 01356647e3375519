// The router under test: one outbox-cdc process, started from the built binary and stopped by a
// signal.

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/freeport"
)

// routerProc is a running outbox-cdc process.
type routerProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *suite) startRouter() (*routerProc, error) {
	proxied := s.pgURL
	if s.proxy != nil {
		var err error
		if proxied, err = s.proxy.URL(s.pgURL); err != nil {
			return nil, err
		}
	}
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.o.binary, "run")
	cmd.Env = append(os.Environ(),
		"OUTBOX_CDC_POSTGRES="+proxied, "OUTBOX_CDC_BROKERS="+strings.Join(s.brokers, ","),
		"OUTBOX_CDC_TABLE="+s.table, "OUTBOX_CDC_SLOT="+s.slot, "OUTBOX_CDC_PUBLICATION="+s.pub,
		"OUTBOX_CDC_TOPIC="+s.pfx+".{event_type}", "OUTBOX_CDC_STATUS_INTERVAL=2s", "OUTBOX_CDC_RECEIVE_TIMEOUT=5s",
		"OUTBOX_CDC_STANDBY_POLL_INTERVAL=500ms", "OUTBOX_CDC_SHUTDOWN_TIMEOUT=10s", "OUTBOX_CDC_LOG_FORMAT=json",
		"OUTBOX_CDC_METRICS_ADDR="+metrics, "OUTBOX_CDC_DELIVERY="+s.o.delivery, "OUTBOX_CDC_CHECKPOINT_TOPIC="+s.pfx+".checkpoints",
		// The delivery checker reads the record timestamp as the order of production.
		"OUTBOX_CDC_RECORD_TIMESTAMP=produce", "OUTBOX_CDC_MESSAGE_PREFIXES="+messagePrefix)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", s.o.binary, err)
	}
	r := &routerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(r.done)
	}()
	return r, nil
}

// stop signals the process and waits for it; it returns the exit code.
func (r *routerProc) stop(sig syscall.Signal) int {
	select {
	case <-r.done:
		return r.cmd.ProcessState.ExitCode()
	default:
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	return r.cmd.ProcessState.ExitCode()
}
