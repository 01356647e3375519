package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Coordinator assigns sources to the instances of a fleet with a Kafka consumer group, as Kafka
// Connect spreads its tasks. Each source has a unit topic of its own, named after the source and
// the database and slot it streams (UnitTopic): an instance subscribes to the unit topics of the
// sources its configuration lists, and a source is streamed by the member that is assigned its unit
// topic's partition 0. Franz-go's cooperative-sticky balancer spreads the units evenly, moves one
// only when its instance leaves (at once), dies (after the session timeout) or another joins, and
// gives a unit only to members subscribed to it: during a rolling update where instances hold
// different sources lists, a source only one side knows is streamed by that side, and adding or
// removing a source renumbers nothing. The pause states live in the state topic (Topic, compacted,
// keyed by source name), which every instance reads to its end before it joins the group.
type Coordinator struct {
	// Group is the consumer group's id; Topic the state topic, which also prefixes the unit topics.
	Group, Topic string
	// Instance names this instance (the group member's client id).
	Instance string
	// SessionTimeout is how long an instance may be silent before the group moves its sources.
	SessionTimeout time.Duration
	// RebalanceTimeout bounds how long an instance may take to release what it must give up (its
	// pipelines' graceful stop).
	RebalanceTimeout time.Duration
	// ReplicationFactor is the topics' replication factor when created (-1: the broker's default).
	ReplicationFactor int16
	// ClientOpts connect to the brokers (seed brokers, TLS, SASL).
	ClientOpts []kgo.Opt
	// Log receives the assignments.
	Log *slog.Logger
	// LegacyTopic, when set, is the state topic an earlier release used for these sources (a group
	// named after a hash of the sources list): when Topic is created, the pause states found there are
	// copied into it, so that an upgrade keeps them.
	LegacyTopic string
	// WatchInterval is how often the topics are checked while running (default 15 s).
	WatchInterval time.Duration

	mu       sync.Mutex
	units    map[string]string     // unit topic -> source name, for this instance's sources
	members  map[string]Member     // source name -> the source, for this instance's sources
	control  *kgo.Client           // reads and writes the pause states, once caught up
	group    *kgo.Client           // the group member
	stateID  kadm.TopicID          // the state topic's id as this instance knows it
	oldIDs   map[kadm.TopicID]bool // ids the state topic had before it was made again
	pauses   map[string]stored     // the latest pause state of every source seen in the state topic
	released map[string]bool       // unit topics this instance stepped back from (Release)
	problem  string                // what is wrong with the coordination now ("" when nothing)
	owners   struct {
		at  time.Time
		m   map[string]string
		err error
	}
}

// Member is a source as the coordination knows it.
type Member struct {
	// Name is the source's name.
	Name string
	// Identity is what the source streams: its database and slot ("orders/orders_slot"), not the
	// host, so that a host string changed by a rolling update keeps the source's unit.
	Identity string
}

// unit is the short hash of a source's identity in its unit topic's name and its pause records.
func (m Member) unit() string {
	sum := sha256.Sum256([]byte(m.Identity))
	return hex.EncodeToString(sum[:4])
}

// UnitTopic is the unit topic of source m in the fleet whose state topic is stateTopic.
func UnitTopic(stateTopic string, m Member) string {
	return stateTopic + "." + m.Name + "." + m.unit()
}

// stored is a pause state as read from the state topic, with where it was read.
type stored struct {
	Pause
	partition int32
	offset    int64
}

// olderThan reports whether p, read at partition/offset, was written after s: by its time, then by
// its place in the topic.
func (s stored) olderThan(p Pause, partition int32, offset int64) bool {
	if !p.At.Equal(s.At) {
		return p.At.After(s.At)
	}
	return partition != s.partition || offset > s.offset
}

// Events receives what the coordination decides for this instance.
type Events interface {
	// Assigned says a source is this instance's (true) or no longer (false: it must return only once
	// the source is stopped, its slot released).
	Assigned(name string, assigned bool)
	// Paused says an operator paused (or resumed) a source, fleet-wide.
	Paused(name string, p Pause)
}

// Pause is a source's pause state, written to the state topic by the fleet API.
type Pause struct {
	Paused bool      `json:"paused"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
	// Unit is the hash of the source's identity (Member.Identity) when it was written: a source of
	// another fleet sharing the group under the same name is not paused by it. Empty in the records
	// of earlier releases, which apply by name.
	Unit string `json:"unit,omitempty"`
}

// errStateTopic marks a state topic that cannot keep the fleet's state: no retry changes it.
var errStateTopic = errors.New("the fleet's coordination topic cannot keep its state")

// Run reads the sources' pause states, joins the group and reports to ev each source assigned to this
// instance and each taken away, and every pause and resume, until ctx ends; it then leaves the group.
// It returns an error only when the coordination cannot work: the principal is refused the topics or
// the group, or the state topic deletes what it holds.
func (c *Coordinator) Run(ctx context.Context, sources []Member, ev Events) error {
	if c.WatchInterval <= 0 {
		c.WatchInterval = 15 * time.Second
	}
	c.mu.Lock()
	c.units, c.members, c.pauses, c.released = map[string]string{}, map[string]Member{}, map[string]stored{}, map[string]bool{}
	var topics []string
	for _, m := range sources {
		t := UnitTopic(c.Topic, m)
		c.units[t], c.members[m.Name] = m.Name, m
		topics = append(topics, t)
	}
	c.mu.Unlock()
	slices.Sort(topics)
	// Kafka away at start is no reason to stop: retry, saying why, until the topics are there.
	for bo := retryBackoff(); ; {
		err := c.ensureTopics(ctx, topics)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if denied(err) {
			return c.deniedError(err)
		}
		if errors.Is(err, errStateTopic) {
			return err
		}
		wait := bo.NextBackOff()
		c.Log.Warn("fleet: cannot set up the coordination topics; no source starts until they are there (needs the right to create them, or create them, compacted, with one partition each)",
			"topic", c.Topic, "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	apply := func(parts map[string][]int32, assigned bool, how string) {
		var changed []string
		var wg sync.WaitGroup
		for topic, ps := range parts {
			name, ok := c.sourceOf(topic)
			if !ok || !slices.Contains(ps, 0) {
				continue // not one of this instance's sources, or a partition someone added to its unit
			}
			changed = append(changed, name)
			// Released all at once: each waits for its pipeline's graceful stop.
			wg.Add(1)
			go func() {
				defer wg.Done()
				ev.Assigned(name, assigned)
			}()
		}
		wg.Wait()
		if len(changed) > 0 {
			slices.Sort(changed)
			c.Log.Info("fleet: sources "+how, "sources", changed, "group", c.Group, "instance", c.Instance)
		}
	}
	// The pause states first, read to the end: a paused source assigned here must not start.
	control, err := kgo.NewClient(append(slices.Clone(c.ClientOpts), kgo.ConsumeTopics(c.Topic), kgo.ClientID(c.Instance),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.MetadataMaxAge(10*time.Second))...)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	defer control.Close()
	if err := c.catchUp(ctx, control, ev); err != nil {
		return nil // ctx ended
	}
	c.mu.Lock()
	c.control = control
	c.mu.Unlock()
	go c.readControl(ctx, control, ev)

	cl, err := kgo.NewClient(append(slices.Clone(c.ClientOpts),
		kgo.ClientID(c.Instance),
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.HeartbeatInterval(max(c.SessionTimeout/6, 100*time.Millisecond)),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.DisableAutoCommit(),
		kgo.MetadataMaxAge(10*time.Second),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			apply(m, true, "assigned to this instance")
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			apply(m, false, "moved away (released)")
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			// The group may already have given them to another instance: stop at once; the slot
			// keeps two instances from streaming one source meanwhile.
			apply(m, false, "lost with the group session (stopped)")
		}),
	)...)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	c.mu.Lock()
	c.group = cl
	c.mu.Unlock()
	defer cl.Close() // leaves the group (OnPartitionsRevoked for what is still assigned)
	defer func() {
		c.mu.Lock()
		c.group = nil // a Release still waiting no longer touches the closed client
		c.mu.Unlock()
	}()
	go c.watch(ctx, topics)
	c.Log.Info("fleet: joining the group that shares the sources", "group", c.Group, "instance", c.Instance, "topic", c.Topic, "sources", len(sources))
	var repeated throttle
	var fatal error
	for ctx.Err() == nil && fatal == nil {
		// The unit topics hold no records: polling keeps the member going and reports errors (the
		// same one at most once a minute).
		fetches := cl.PollFetches(ctx)
		fetches.EachError(func(topic string, p int32, err error) {
			if denied(err) {
				fatal = c.deniedError(err) // waiting cannot grant it
				return
			}
			if errors.Is(err, context.Canceled) || !repeated.allow(err.Error()) {
				return
			}
			c.Log.Warn("fleet: the group member cannot consume a unit topic; the sources it holds stream on, but changes wait", "topic", topic, "partition", p, "error", err.Error())
		})
		if fetches.Err0() != nil {
			select { // an error comes back at once: do not spin
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return fatal
}

// sourceOf returns the source of this instance whose unit topic is topic.
func (c *Coordinator) sourceOf(topic string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name, ok := c.units[topic]
	return name, ok
}

// apply records pause state p of source name, read at partition/offset of the state topic, and tells
// ev when it is this instance's source and newer than what it knew. A state written for another
// source of the same name (another fleet sharing the group) is kept out.
func (c *Coordinator) apply(ev Events, name string, p Pause, partition int32, offset int64) {
	c.mu.Lock()
	last, seen := c.pauses[name]
	m, mine := c.members[name]
	if seen && !last.olderThan(p, partition, offset) {
		c.mu.Unlock()
		return
	}
	foreign := mine && p.Unit != "" && p.Unit != m.unit()
	if !foreign {
		c.pauses[name] = stored{Pause: p, partition: partition, offset: offset}
	}
	c.mu.Unlock()
	if foreign {
		c.Log.Warn("fleet: a pause state in the coordination topic is for another source of the same name (another fleet in this group?); ignored: give each fleet its own fleet.group",
			"source", name, "topic", c.Topic)
		return
	}
	if mine {
		ev.Paused(name, p)
	}
}

// record applies one record of the state topic.
func (c *Coordinator) record(ev Events, r *kgo.Record) {
	var p Pause
	if err := json.Unmarshal(r.Value, &p); err != nil || len(r.Key) == 0 {
		c.Log.Warn("fleet: a record of the coordination topic is not a pause state; ignored", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
		return
	}
	c.apply(ev, string(r.Key), p, r.Partition, r.Offset)
}

// catchUp applies the state topic's records up to its end offsets of the moment it started, and
// returns once it has (nil) or when ctx ends (its error). A partition whose records are gone
// (deleted by retention, the log start at or past its end) counts as read: nothing of it remains.
func (c *Coordinator) catchUp(ctx context.Context, cl *kgo.Client, ev Events) error {
	adm := kadm.NewClient(cl)
	var need map[int32]int64 // partition -> end offset still to reach
	for bo := retryBackoff(); ; {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		var err error
		need, err = router.ToRead(actx, adm, c.Topic)
		cancel()
		if err == nil {
			break
		}
		wait := bo.NextBackOff()
		c.Log.Warn("fleet: cannot read the end of the coordination topic; retrying", "topic", c.Topic, "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	slow := time.AfterFunc(30*time.Second, func() {
		c.Log.Warn("fleet: still reading the pause states of the coordination topic; no source starts until they are read", "topic", c.Topic)
	})
	defer slow.Stop()
	err := router.ReadToEnd(ctx, cl, c.Topic, need, func(r *kgo.Record) { c.record(ev, r) }, router.ReadOptions{
		Gone: func(p int32, logStart int64) {
			c.Log.Warn("fleet: records of the coordination topic were deleted before this instance read them (cleanup.policy must be compact alone); pause states written there are lost",
				"topic", c.Topic, "partition", p, "log_start", logStart)
		},
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// readControl applies the state topic's records until ctx ends.
func (c *Coordinator) readControl(ctx context.Context, cl *kgo.Client, ev Events) {
	var repeated throttle
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !repeated.allow(err.Error()) {
				return
			}
			c.Log.Warn("fleet: cannot read the pause states in the coordination topic", "topic", topic, "partition", p, "error", err.Error())
		})
		if fetches.Err0() != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		fetches.EachRecord(func(r *kgo.Record) { c.record(ev, r) })
	}
}

// SetPause records a source's pause state for the whole fleet: the instance streaming it stops it (or
// starts it again), and so does any instance it moves to later.
func (c *Coordinator) SetPause(ctx context.Context, name string, p Pause) error {
	c.mu.Lock()
	cl := c.control
	m, ok := c.members[name]
	c.mu.Unlock()
	if cl == nil || !ok {
		return fmt.Errorf("fleet coordination is not running, or %q is not one of its sources", name)
	}
	p.Unit = m.unit()
	return c.write(ctx, cl, name, p)
}

// write produces pause state p of source name to the state topic's first partition (topics of
// earlier releases have more; readers order the states by time).
func (c *Coordinator) write(ctx context.Context, cl *kgo.Client, name string, p Pause) error {
	value, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: c.Topic, Partition: 0, Key: []byte(name), Value: value}).FirstErr(); err != nil {
		return fmt.Errorf("record the pause state of %s in %s: %w", name, c.Topic, err)
	}
	return nil
}

// ownersTTL is how long a description of the group serves the API: a GET must not cost a Kafka round
// trip per request.
const ownersTTL = 2 * time.Second

// Owners returns, for each source of this instance assigned in the group, the instance (client id)
// it is assigned to. The group's description is kept for ownersTTL.
func (c *Coordinator) Owners(ctx context.Context) (map[string]string, error) {
	c.mu.Lock()
	cl, cached := c.group, c.owners
	c.mu.Unlock()
	if cl == nil {
		return nil, errors.New("fleet coordination is not running")
	}
	if time.Since(cached.at) < ownersTTL {
		return cached.m, cached.err
	}
	owners, err := c.describe(ctx, cl)
	c.mu.Lock()
	c.owners.at, c.owners.m, c.owners.err = time.Now(), owners, err
	c.mu.Unlock()
	return owners, err
}

// describe asks Kafka who holds which unit.
func (c *Coordinator) describe(ctx context.Context, cl *kgo.Client) (map[string]string, error) {
	groups, err := kadm.NewClient(cl).DescribeGroups(ctx, c.Group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", c.Group, err)
	}
	owners := map[string]string{}
	for _, g := range groups {
		if g.Err != nil {
			return nil, fmt.Errorf("describe group %s: %w", c.Group, g.Err)
		}
		for _, m := range g.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			for _, t := range a.Topics {
				if name, ok := c.sourceOf(t.Topic); ok && slices.Contains(t.Partitions, 0) {
					owners[name] = m.ClientID
				}
			}
		}
	}
	return owners, nil
}

// Problem says what is wrong with the coordination now (the state topic deleted, or made to delete
// what it holds); empty when nothing is.
func (c *Coordinator) Problem() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.problem
}

// denied reports an authorization error of Kafka: no retry grants the right.
func denied(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// deniedError says what the instances need to share the sources, or how to do without.
func (c *Coordinator) deniedError(err error) error {
	return fmt.Errorf("fleet coordination: Kafka refuses this instance's principal the topics %s and %s.* or the group %s (%w): grant it create, describe, read and write on them and read on the group, or set fleet.coordination: none (every instance then streams every source it can take)",
		c.Topic, c.Topic, c.Group, err)
}

// throttle lets a log line through, and the same one again only after a minute: an error that comes
// back at every poll is said once a minute, a new one at once.
type throttle struct {
	last string
	at   time.Time
}

// allow reports whether msg may be logged now, and notes it.
func (t *throttle) allow(msg string) bool {
	if msg == t.last && time.Since(t.at) < time.Minute {
		return false
	}
	t.last, t.at = msg, time.Now()
	return true
}

// retryBackoff is the wait between attempts to reach Kafka at start: 1 s, doubling up to 30 s, a
// little jitter so that instances started together do not ask together.
func retryBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.Multiplier, bo.RandomizationFactor = time.Second, 30*time.Second, 2, 0.2
	return bo
}
