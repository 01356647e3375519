package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/fleet"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// recorder records a coordinator's events in order, and what is assigned and paused now.
type recorder struct {
	mu       sync.Mutex
	events   []string
	assigned map[string]bool
	paused   map[string]bool
}

func (r *recorder) Assigned(name string, assigned bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("assigned %s %t", name, assigned))
	if r.assigned == nil {
		r.assigned = map[string]bool{}
	}
	r.assigned[name] = assigned
}

func (r *recorder) Paused(name string, p fleet.Pause) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("paused %s %t", name, p.Paused))
	if r.paused == nil {
		r.paused = map[string]bool{}
	}
	r.paused[name] = p.Paused
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// holds returns the sources assigned to the recorder's instance now, sorted.
func (r *recorder) holds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for name, a := range r.assigned {
		if a {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (r *recorder) isPaused(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused[name]
}

func (r *recorder) saw(event string) bool { return slices.Contains(r.snapshot(), event) }

func coordinator(t *testing.T, group, instance string) *fleet.Coordinator {
	return &fleet.Coordinator{
		Group: group, Topic: "outbox-cdc.fleet." + group, Instance: instance, SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 30 * time.Second, ReplicationFactor: -1, ClientOpts: []kgo.Opt{kgo.SeedBrokers(testenv.Brokers(t)...)}, Log: testLogger(),
		WatchInterval: time.Second,
	}
}

// members are sources of the given names, each with a database and slot of its own.
func members(names ...string) []fleet.Member {
	out := make([]fleet.Member, len(names))
	for i, n := range names {
		out[i] = fleet.Member{Name: n, Identity: "db_" + n + "/slot_" + n}
	}
	return out
}

// instance is a running coordinator with its recorder.
type instance struct {
	c    *fleet.Coordinator
	rec  *recorder
	stop context.CancelFunc
	done chan error
}

func startInstance(t *testing.T, group, name string, sources []fleet.Member) *instance {
	t.Helper()
	in := &instance{c: coordinator(t, group, name), rec: &recorder{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	in.stop = func() {
		cancel()
		select {
		case <-in.done:
		case <-time.After(60 * time.Second):
			t.Errorf("instance %s did not leave within 60 s", name)
		}
	}
	go func() { in.done <- in.c.Run(ctx, sources, in.rec) }()
	t.Cleanup(cancel)
	return in
}

func newGroup() string { return fmt.Sprintf("test-fleet-%06x", rand.IntN(0xffffff)) }

// TestPauseIsKnownBeforeAssignment: an instance that joins a fleet where a source is paused learns the
// pause before it is assigned the source, so it never starts it, not even for a moment.
func TestPauseIsKnownBeforeAssignment(t *testing.T) {
	testenv.Brokers(t) // fails with how to start Kafka when it is not there (skips only under -short)
	group := newGroup()
	sources := members("a", "b", "c")

	// A first instance pauses b and leaves.
	first := startInstance(t, group, "first", sources)
	testenv.WaitFor(t, 60*time.Second, "the first instance assigned every source", func() bool { return len(first.rec.holds()) == 3 })
	if err := first.c.SetPause(context.Background(), "b", fleet.Pause{Paused: true, By: "test"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the first instance seeing the pause", func() bool { return first.rec.isPaused("b") })
	first.stop()

	// A second instance joins: the pause of b comes before b is assigned.
	second := startInstance(t, group, "second", sources)
	testenv.WaitFor(t, 60*time.Second, "the second instance assigned b", func() bool { return second.rec.saw("assigned b true") })
	events := second.rec.snapshot()
	if i, j := slices.Index(events, "paused b true"), slices.Index(events, "assigned b true"); i < 0 || i > j {
		t.Fatalf("b was assigned before its pause was known: %v", events)
	}
}

// owners maps each source to the instances that hold it now.
func owners(ins ...*instance) map[string][]string {
	out := map[string][]string{}
	for _, in := range ins {
		for _, s := range in.rec.holds() {
			out[s] = append(out[s], in.c.Instance)
		}
	}
	return out
}

// eachOnce reports whether every one of names is held by exactly one instance.
func eachOnce(own map[string][]string, names ...string) bool {
	for _, n := range names {
		if len(own[n]) != 1 {
			return false
		}
	}
	return len(own) == len(names)
}

// TestRollingUpdateOfTheSourcesList: two instances share a, b, c with c paused; a rolling update
// brings two instances whose list drops a and adds d. While all four run, every source is held by
// exactly one instance, a only by the old ones and d only by the new ones, and c stays paused on
// whichever instance holds it; once the old instances leave, the new ones hold b, c and d, split
// evenly, and c is still paused. The group and its state are one throughout: no instance is in a
// group of its own.
func TestRollingUpdateOfTheSourcesList(t *testing.T) {
	testenv.Brokers(t)
	group := newGroup()
	oldList, newList := members("a", "b", "c"), members("b", "c", "d")
	old1 := startInstance(t, group, "old-1", oldList)
	old2 := startInstance(t, group, "old-2", oldList)
	testenv.WaitFor(t, 60*time.Second, "the old instances sharing a, b, c", func() bool { return eachOnce(owners(old1, old2), "a", "b", "c") })
	if err := old1.c.SetPause(context.Background(), "c", fleet.Pause{Paused: true, By: "test"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the pause seen", func() bool { return old1.rec.isPaused("c") && old2.rec.isPaused("c") })

	new1 := startInstance(t, group, "new-1", newList)
	new2 := startInstance(t, group, "new-2", newList)
	all := []*instance{old1, old2, new1, new2}
	testenv.WaitFor(t, 60*time.Second, "a, b, c, d each on one instance of the four", func() bool {
		own := owners(all...)
		return eachOnce(own, "a", "b", "c", "d") && !slices.Contains(own["d"], "old-1") && !slices.Contains(own["d"], "old-2") &&
			!slices.Contains(own["a"], "new-1") && !slices.Contains(own["a"], "new-2") && len(new1.rec.holds())+len(new2.rec.holds()) > 0
	})
	for _, in := range []*instance{new1, new2} {
		if slices.Contains(in.rec.holds(), "c") && !in.rec.isPaused("c") {
			t.Errorf("%s holds c without knowing it is paused", in.c.Instance)
		}
	}
	old1.stop()
	old2.stop()
	testenv.WaitFor(t, 60*time.Second, "the new instances holding b, c, d, split 2/1", func() bool {
		own := owners(new1, new2)
		n1, n2 := len(new1.rec.holds()), len(new2.rec.holds())
		return eachOnce(own, "b", "c", "d") && max(n1, n2) == 2 && min(n1, n2) == 1
	})
	if !new1.rec.isPaused("c") || !new2.rec.isPaused("c") {
		t.Errorf("the pause of c was forgotten in the rolling update: new-1 %t, new-2 %t", new1.rec.isPaused("c"), new2.rec.isPaused("c"))
	}
	// The API's view of the owners, from either new instance.
	own, err := new1.c.Owners(context.Background())
	if err != nil || len(own) != 3 {
		t.Errorf("owners: %v %v", own, err)
	}
}

// TestStateTopicThatDeletesIsRefused: a coordination topic someone created with delete retention
// would forget the pauses: the instance refuses to start, naming the setting and the fix.
func TestStateTopicThatDeletesIsRefused(t *testing.T) {
	testenv.Brokers(t)
	group := newGroup()
	adm := admin(t)
	if _, err := adm.CreateTopic(context.Background(), 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact,delete")}, "outbox-cdc.fleet."+group); err != nil {
		t.Fatal(err)
	}
	in := startInstance(t, group, "one", members("a"))
	select {
	case err := <-in.done:
		if err == nil || !strings.Contains(err.Error(), "cleanup.policy=compact,delete") || !strings.Contains(err.Error(), "--add-config cleanup.policy=compact") {
			t.Fatalf("run: %v, want a refusal naming cleanup.policy and the fix", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("an instance started on a coordination topic that deletes its records")
	}
}

// TestCatchUpWhenRecordsAreGone: the coordination topic's records were deleted before an instance
// read them (it had delete retention once, set to compact since): its log start is past its last
// record. A new instance does not wait for records that are gone: it joins and takes its sources.
func TestCatchUpWhenRecordsAreGone(t *testing.T) {
	testenv.Brokers(t)
	group := newGroup()
	adm := admin(t)
	ctx := context.Background()
	topic := "outbox-cdc.fleet." + group
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, topic); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 5 {
		rec := &kgo.Record{Topic: topic, Key: []byte("a"), Value: fmt.Appendf(nil, `{"paused": %t, "at": "2026-12-07T10:00:0%dZ"}`, i%2 == 0, i)}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := adm.DeleteRecords(ctx, kadm.Offsets(ends.Offsets()))
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "cleanup.policy", Value: kadm.StringPtr("compact")}}, topic); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	in := startInstance(t, group, "one", members("a", "b"))
	testenv.WaitFor(t, 45*time.Second, "the instance holding a and b", func() bool { return len(in.rec.holds()) == 2 })
	t.Logf("joined %s after its start, the topic's records gone", time.Since(began).Round(100*time.Millisecond))
	if in.rec.isPaused("a") {
		t.Error("a pause state that was deleted was applied")
	}
}

// TestStateTopicDeletedUnderRunningInstances: the coordination topic is deleted while instances run,
// one source paused. The instances notice, make it again and write the pause back, so that an
// instance joining later still finds the source paused; Problem says what happened meanwhile.
func TestStateTopicDeletedUnderRunningInstances(t *testing.T) {
	testenv.Brokers(t)
	group := newGroup()
	topic := "outbox-cdc.fleet." + group
	one := startInstance(t, group, "one", members("a", "b"))
	testenv.WaitFor(t, 60*time.Second, "one holding a and b", func() bool { return len(one.rec.holds()) == 2 })
	if err := one.c.SetPause(context.Background(), "b", fleet.Pause{Paused: true, By: "test"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the pause seen", func() bool { return one.rec.isPaused("b") })
	adm := admin(t)
	if _, err := adm.DeleteTopic(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the topic made again with b's pause", func() bool {
		recs := readAll(t, topic)
		return slices.ContainsFunc(recs, func(r *kgo.Record) bool {
			return string(r.Key) == "b" && strings.Contains(string(r.Value), `"paused":true`)
		})
	})
	if p := one.c.Problem(); !strings.Contains(p, "deleted") {
		t.Errorf("Problem() = %q, want it to say the topic was deleted", p)
	}
	testenv.WaitFor(t, 30*time.Second, "the problem cleared once the topic is back", func() bool { return one.c.Problem() == "" })
	// A new instance learns b's pause before it may be assigned b.
	two := startInstance(t, group, "two", members("a", "b"))
	one.stop()
	testenv.WaitFor(t, 60*time.Second, "two holding a and b", func() bool { return len(two.rec.holds()) == 2 })
	events := two.rec.snapshot()
	if i, j := slices.Index(events, "paused b true"), slices.Index(events, "assigned b true"); i < 0 || i > j {
		t.Fatalf("b was assigned before its pause was known after the topic was deleted: %v", events)
	}
	// A unit topic deleted is made again, and its source assigned anew.
	units, err := adm.ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var unitA string
	for _, n := range units.Names() {
		if strings.HasPrefix(n, topic+".a.") {
			unitA = n
		}
	}
	before := units[unitA].ID
	if _, err := adm.DeleteTopic(context.Background(), unitA); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the unit topic of a made again and a held", func() bool {
		d, err := adm.ListTopics(context.Background(), unitA)
		return err == nil && d[unitA].Err == nil && d[unitA].ID != before && len(d[unitA].Partitions) == 1 && slices.Contains(two.rec.holds(), "a")
	})
}

// admin is an admin client of the test broker.
func admin(t *testing.T) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.Brokers(t)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// readAll reads topic from its start to its end now.
func readAll(t *testing.T, topic string) []*kgo.Record {
	t.Helper()
	adm := admin(t)
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil || ends.Error() != nil {
		return nil
	}
	want := int64(0)
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	if want == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.Brokers(t)...), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for int64(len(out)) < want {
		f := cl.PollFetches(ctx)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			break
		}
		out = append(out, f.Records()...)
	}
	return out
}

// TestReleaseOffersTheSourceToAnother: an instance that steps back from a source (a cause local to
// it, such as a table its configuration lacks) lets the group give it to another instance that lists
// it, and takes its part in the group again after the wait.
func TestReleaseOffersTheSourceToAnother(t *testing.T) {
	testenv.Brokers(t)
	group := newGroup()
	one := startInstance(t, group, "one", members("a"))
	testenv.WaitFor(t, 60*time.Second, "one holding a", func() bool { return slices.Contains(one.rec.holds(), "a") })
	two := startInstance(t, group, "two", members("a"))
	time.Sleep(2 * time.Second) // two joined; a stays where it is (sticky)
	if !slices.Contains(one.rec.holds(), "a") {
		t.Fatal("a moved without a release")
	}
	one.c.Release("a", 3*time.Second)
	testenv.WaitFor(t, 30*time.Second, "two holding a after one stepped back", func() bool {
		return slices.Contains(two.rec.holds(), "a") && !slices.Contains(one.rec.holds(), "a")
	})
	// Back in the group after the wait: one may be given a again when two leaves.
	time.Sleep(4 * time.Second)
	two.stop()
	testenv.WaitFor(t, 30*time.Second, "one holding a again once two left", func() bool { return slices.Contains(one.rec.holds(), "a") })
}

// TestPausesCarriedOverFromTheEarlierGroup: an upgrade from a release whose group was named after a
// hash of the sources list: the first instance of the new group creates its state topic and carries
// the old topic's pause states over (records of the old format, without a unit), so that a source
// paused before the upgrade is never started after it.
func TestPausesCarriedOverFromTheEarlierGroup(t *testing.T) {
	testenv.Brokers(t)
	legacy := "outbox-cdc.fleet.outbox-cdc-fleet-" + newGroup()
	adm := admin(t)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 2, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, legacy); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.Brokers(t)...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, r := range []*kgo.Record{
		{Topic: legacy, Partition: 1, Key: []byte("b"), Value: []byte(`{"paused": false, "at": "2026-12-01T10:00:00Z"}`)},
		{Topic: legacy, Partition: 1, Key: []byte("b"), Value: []byte(`{"paused": true, "by": "oncall", "at": "2026-12-02T10:00:00Z"}`)},
		{Topic: legacy, Partition: 0, Key: []byte("a"), Value: []byte(`{"paused": false, "at": "2026-12-02T11:00:00Z"}`)},
	} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	group := newGroup()
	in := &instance{c: coordinator(t, group, "upgraded"), rec: &recorder{}, done: make(chan error, 1)}
	in.c.LegacyTopic = legacy
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { in.done <- in.c.Run(rctx, members("a", "b"), in.rec) }()
	testenv.WaitFor(t, 60*time.Second, "the upgraded instance assigned b", func() bool { return in.rec.saw("assigned b true") })
	events := in.rec.snapshot()
	if i, j := slices.Index(events, "paused b true"), slices.Index(events, "assigned b true"); i < 0 || i > j {
		t.Fatalf("b's pause from the earlier group was not carried over before b was assigned: %v", events)
	}
	if in.rec.isPaused("a") {
		t.Error("a was not paused in the earlier group")
	}
}
