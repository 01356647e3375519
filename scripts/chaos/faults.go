// The faults: which kinds are injected and when (a bag drawn until empty), how each is injected
// (router killed or stopped, Kafka or PostgreSQL restarted, the network cut), and the duplicates each
// kind caused.

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fault kinds, in the order the summary prints them.
var kinds = []string{"kill", "term", "kafka", "pg_fast", "pg_immediate", "cut", "blackhole"}

// faultAt is one injected fault: its kind, when it began and when it ended (the router restarted,
// the service back); end is zero while it runs.
type faultAt struct {
	kind string
	at   time.Time
	end  time.Time
}

// duplicatesByFault says how many duplicate records each kind of fault caused, and how many per
// fault of that kind. A duplicate is put down to the first fault that had not ended when its event
// was committed: the fault under way then (a broker that writes what it is sent while it stops, and
// whose acknowledgements are lost with it), or else the next one (the event was sent before it, and
// the replay after it sent it again). An event sent twice with no fault ending after its commit
// counts as "none" (a needless duplicate).
func (s *suite) duplicatesByFault(got []*kgo.Record) string {
	return duplicatesByFault(got, s.committed, s.commitAt, s.faultLog, s.kinds)
}

// duplicatesByFault is suite.duplicatesByFault over the run's committed events (per writer), their
// commit times, the faults in order and the kinds the run injects.
func duplicatesByFault(got []*kgo.Record, committed [][]testenv.Event, commitAt [][]time.Time, faultLog []faultAt, kinds []string) string {
	copies := map[string]int{}
	for _, r := range got {
		copies[testenv.EventID(r)]++
	}
	byKind := map[string]int{}
	for w, evs := range committed {
		for i, e := range evs {
			n := copies[e.ID]
			if n < 2 {
				continue
			}
			at := commitAt[w][i]
			// Faults run one after the other, so their ends are in order too; a fault still running
			// (no end) is the last one.
			j, _ := slices.BinarySearchFunc(faultLog, at, func(f faultAt, t time.Time) int {
				if f.end.IsZero() {
					return 1
				}
				return f.end.Compare(t)
			})
			kind := "none"
			if j < len(faultLog) {
				kind = faultLog[j].kind
			}
			byKind[kind] += n - 1
		}
	}
	injected := map[string]int{}
	for _, f := range faultLog {
		injected[f.kind]++
	}
	var parts []string
	for _, k := range append(slices.Clone(kinds), "none") {
		if k == "none" && byKind[k] == 0 {
			continue
		}
		part := fmt.Sprintf("%s:%d", k, byKind[k])
		if n := injected[k]; n > 0 {
			part += fmt.Sprintf(" (%.0f per fault)", float64(byKind[k])/float64(n))
		}
		parts = append(parts, part)
	}
	return "duplicates by fault: " + strings.Join(parts, ", ")
}

// faultBag is a shuffled round of faults: every kind once, plus what the minimums still need in
// proportion (kills dominate a long run).
func (s *suite) faultBag() []string {
	bag := slices.Clone(s.kinds)
	for k, min := range s.o.minimum {
		for i := s.faults[k] + 1; i < min && len(bag) < 40; i += len(s.kinds) {
			bag = append(bag, k)
		}
	}
	rand.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
	return bag
}

// inject runs one fault, then waits until the router has confirmed everything committed before the
// fault ended.
func (s *suite) inject(ctx context.Context, kind string) error {
	s.faultLog = append(s.faultLog, faultAt{kind: kind, at: time.Now()})
	var err error
	switch kind {
	case "kill", "term":
		sig := syscall.SIGKILL
		if kind == "term" {
			sig = syscall.SIGTERM
		}
		if code := s.router.stop(sig); kind == "term" && code != 0 {
			s.unrecovered = append(s.unrecovered, fmt.Sprintf("SIGTERM exit code %d, want 0", code))
		}
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
		s.router, err = s.startRouter()
	case "kafka":
		if err = services("kafka-stop"); err == nil {
			time.Sleep(time.Duration(3+rand.IntN(8)) * time.Second)
			err = services("kafka-start")
		}
	case "pg_fast":
		err = services("pg-restart", "fast")
	case "pg_immediate":
		err = services("pg-restart", "immediate")
	case "cut":
		s.proxy.Cut()
	case "blackhole":
		s.proxy.BlackHole()
	case "failover":
		err = s.failover(ctx)
	}
	if err != nil {
		return err
	}
	s.faults[kind]++
	end := time.Now()
	s.faultLog[len(s.faultLog)-1].end = end
	target := s.currentLSN(ctx)
	if err := s.waitCaughtUp(ctx, target, s.o.recoverWait); err != nil {
		s.unrecovered = append(s.unrecovered, fmt.Sprintf("%s at %s: %v", kind, end.Format(time.TimeOnly), err))
		return nil
	}
	s.recoveries = append(s.recoveries, time.Since(end))
	return nil
}

func services(args ...string) error {
	out, err := exec.Command("bash", append([]string{"scripts/services.sh"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/services.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
