package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Coordinator assigns sources to the instances of a fleet with a Kafka consumer group, as Kafka
// Connect spreads its tasks: a topic of its own has one partition per source (partition i is the
// i-th source in name order), every instance consumes it in one group with the cooperative-sticky
// balancer, and the partitions an instance is assigned are the sources it streams. The group moves a
// source when its instance leaves (at once), dies (after the session timeout) or another joins, and
// keeps them spread evenly; cooperative rebalancing moves only what must move, and a source is
// released (its pipeline stopped, its slot freed) before it is given to another instance.
type Coordinator struct {
	// Group is the consumer group's id; Topic the topic whose partitions stand for the sources.
	Group, Topic string
	// Instance names this instance (the group member's client id).
	Instance string
	// SessionTimeout is how long an instance may be silent before the group moves its sources.
	SessionTimeout time.Duration
	// RebalanceTimeout bounds how long an instance may take to release what it must give up (its
	// pipelines' graceful stop).
	RebalanceTimeout time.Duration
	// ReplicationFactor is the topic's replication factor when created (-1: the broker's default).
	ReplicationFactor int16
	// ClientOpts connect to the brokers (seed brokers, TLS, SASL).
	ClientOpts []kgo.Opt
	// Log receives the assignments.
	Log *slog.Logger

	mu      sync.Mutex
	sorted  []string    // the sources in partition order, once Run started
	control *kgo.Client // reads and writes the pause states, once caught up
	group   *kgo.Client // the group member
}

// readControl applies the pause records of the coordination topic; with catchUp it returns once it
// has read up to the end offsets of the moment it started (nil), or when ctx ends (its error).
// Otherwise it reads until ctx ends.
func (c *Coordinator) readControl(ctx context.Context, cl *kgo.Client, ev Events, catchUp bool) error {
	need := map[int32]int64{} // partition -> offset still to reach
	var lastErr string
	var lastAt time.Time
	if catchUp {
		for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
			actx, cancel := context.WithTimeout(ctx, 15*time.Second)
			ends, err := kadm.NewClient(cl).ListEndOffsets(actx, c.Topic)
			cancel()
			if err == nil {
				err = ends.Error()
			}
			if err == nil {
				ends.Each(func(o kadm.ListedOffset) {
					if o.Offset > 0 {
						need[o.Partition] = o.Offset
					}
				})
				break
			}
			c.Log.Warn("fleet: cannot read the end of the coordination topic; retrying", "topic", c.Topic, "error", err.Error(), "retry_in", wait.String())
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
	}
	for {
		if catchUp && len(need) == 0 {
			return nil
		}
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if err.Error() == lastErr && time.Since(lastAt) < time.Minute {
				return
			}
			lastErr, lastAt = err.Error(), time.Now()
			c.Log.Warn("fleet: cannot read the pause states in the coordination topic", "topic", topic, "partition", p, "error", err.Error())
		})
		if fetches.Err0() != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := need[r.Partition]; ok && r.Offset+1 >= end {
				delete(need, r.Partition)
			}
			var p Pause
			if err := json.Unmarshal(r.Value, &p); err != nil {
				c.Log.Warn("fleet: a record of the coordination topic is not a pause state; ignored", "partition", r.Partition, "offset", r.Offset)
				return
			}
			ev.Paused(string(r.Key), p)
		})
	}
}

// SetPause records a source's pause state for the whole fleet: the instance streaming it stops it (or
// starts it again), and so does any instance it moves to later.
func (c *Coordinator) SetPause(ctx context.Context, name string, p Pause) error {
	c.mu.Lock()
	cl, sorted := c.control, c.sorted
	c.mu.Unlock()
	i := slices.Index(sorted, name)
	if cl == nil || i < 0 {
		return fmt.Errorf("fleet coordination is not running, or %q is not one of its sources", name)
	}
	value, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: c.Topic, Partition: int32(i), Key: []byte(name), Value: value}).FirstErr(); err != nil {
		return fmt.Errorf("record the pause state of %s in %s: %w", name, c.Topic, err)
	}
	return nil
}

// Owners returns, for each source assigned in the group, the instance (client id) it is assigned to.
func (c *Coordinator) Owners(ctx context.Context) (map[string]string, error) {
	c.mu.Lock()
	cl, sorted := c.group, c.sorted
	c.mu.Unlock()
	if cl == nil {
		return nil, errors.New("fleet coordination is not running")
	}
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
				if t.Topic != c.Topic {
					continue
				}
				for _, p := range t.Partitions {
					if int(p) < len(sorted) {
						owners[sorted[p]] = m.ClientID
					}
				}
			}
		}
	}
	return owners, nil
}

// Events receives what the coordination decides for this instance.
type Events interface {
	// Assigned says a source is this instance's (true) or no longer (false: it must return only once
	// the source is stopped, its slot released).
	Assigned(name string, assigned bool)
	// Paused says an operator paused (or resumed) a source, fleet-wide.
	Paused(name string, p Pause)
}

// Pause is a source's pause state, written to the coordination topic by the fleet API.
type Pause struct {
	Paused bool      `json:"paused"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
}

// Run reads the sources' pause states, joins the group and reports to ev each source assigned to this
// instance and each taken away, and every pause and resume, until ctx ends; it then leaves the group.
// names are the sources, in any order: the partitions follow their sorted order.
func (c *Coordinator) Run(ctx context.Context, names []string, ev Events) error {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	c.mu.Lock()
	c.sorted = sorted
	c.mu.Unlock()
	set := ev.Assigned
	// Kafka away at start is no reason to stop: retry, saying why, until the topic is there.
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		err := c.ensureTopic(ctx, int32(len(sorted)))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if denied(err) {
			return c.deniedError(err)
		}
		c.Log.Warn("fleet: cannot set up the coordination topic; no source starts until it is there (needs the right to create it, or create it with one partition per source)",
			"topic", c.Topic, "error", err.Error(), "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	source := func(p int32) (string, bool) {
		if p < 0 || int(p) >= len(sorted) {
			return "", false // a partition of a source removed since: nothing to stream
		}
		return sorted[p], true
	}
	apply := func(parts map[string][]int32, assigned bool, how string) {
		var changed []string
		var wg sync.WaitGroup
		for _, p := range parts[c.Topic] {
			if name, ok := source(p); ok {
				changed = append(changed, name)
				// Released all at once: each waits for its pipeline's graceful stop.
				wg.Add(1)
				go func() {
					defer wg.Done()
					set(name, assigned)
				}()
			}
		}
		wg.Wait()
		if len(changed) > 0 {
			slices.Sort(changed)
			c.Log.Info("fleet: sources "+how, "sources", changed, "group", c.Group, "instance", c.Instance)
		}
	}
	opts := append(slices.Clone(c.ClientOpts),
		kgo.ClientID(c.Instance),
		kgo.ConsumerGroup(c.Group),
		kgo.ConsumeTopics(c.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.HeartbeatInterval(max(c.SessionTimeout/6, 100*time.Millisecond)),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.DisableAutoCommit(),
		kgo.MetadataMaxAge(10*time.Second), // partitions added for new sources are seen soon
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
	)
	// The pause states first, read to the end: a paused source assigned here must not start.
	control, err := kgo.NewClient(append(slices.Clone(c.ClientOpts), kgo.ConsumeTopics(c.Topic), kgo.ClientID(c.Instance),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.MetadataMaxAge(10*time.Second))...)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	defer control.Close()
	if err := c.readControl(ctx, control, ev, true); err != nil {
		return nil // ctx ended
	}
	c.mu.Lock()
	c.control = control
	c.mu.Unlock()
	go func() { _ = c.readControl(ctx, control, ev, false) }()

	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	c.mu.Lock()
	c.group = cl
	c.mu.Unlock()
	defer cl.Close() // leaves the group (OnPartitionsRevoked for what is still assigned)
	c.Log.Info("fleet: joining the group that shares the sources", "group", c.Group, "instance", c.Instance, "topic", c.Topic, "sources", len(sorted))
	var lastErr string
	var lastAt time.Time
	var fatal error
	for ctx.Err() == nil && fatal == nil {
		// The records are read by the control client: polling keeps the member going and reports
		// errors (the same one at most once a minute).
		fetches := cl.PollFetches(ctx)
		fetches.EachError(func(topic string, p int32, err error) {
			if denied(err) {
				fatal = c.deniedError(err) // waiting cannot grant it
				return
			}
			if errors.Is(err, context.Canceled) || (err.Error() == lastErr && time.Since(lastAt) < time.Minute) {
				return
			}
			lastErr, lastAt = err.Error(), time.Now()
			c.Log.Warn("fleet: the group member cannot consume the coordination topic; the sources it holds stream on, but changes wait", "topic", topic, "partition", p, "error", err.Error())
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

// denied reports an authorization error of Kafka: no retry grants the right.
func denied(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// deniedError says what the instances need to share the sources, or how to do without.
func (c *Coordinator) deniedError(err error) error {
	return fmt.Errorf("fleet coordination: Kafka refuses this instance's principal the topic %s or the group %s (%w): grant it create, read and write on the topic and read on the group, or set fleet.coordination: none (every instance then streams every source it can take)",
		c.Topic, c.Group, err)
}

// ensureTopic creates the coordination topic with one partition per source, or adds partitions
// when sources were added.
func (c *Coordinator) ensureTopic(ctx context.Context, partitions int32) error {
	cl, err := kgo.NewClient(c.ClientOpts...)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg := map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}
	res, err := adm.CreateTopic(actx, partitions, c.ReplicationFactor, cfg, c.Topic)
	if err == nil {
		err = res.Err
	}
	switch {
	case err == nil:
		c.Log.Info("fleet: created the coordination topic", "topic", c.Topic, "partitions", partitions)
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists): // another instance created it, or an earlier run
	default:
		return fmt.Errorf("fleet coordination: create topic %s: %w", c.Topic, err)
	}
	details, err := adm.ListTopics(actx, c.Topic)
	if err != nil {
		return fmt.Errorf("fleet coordination: describe topic %s: %w", c.Topic, err)
	}
	d, ok := details[c.Topic]
	if !ok || d.Err != nil {
		return fmt.Errorf("fleet coordination: describe topic %s: %v", c.Topic, d.Err)
	}
	if have := int32(len(d.Partitions)); have < partitions {
		if _, err := adm.UpdatePartitions(actx, int(partitions), c.Topic); err != nil {
			return fmt.Errorf("fleet coordination: grow topic %s to %d partitions: %w", c.Topic, partitions, err)
		}
		c.Log.Info("fleet: grew the coordination topic for added sources", "topic", c.Topic, "partitions", partitions)
	}
	return nil
}
