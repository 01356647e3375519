package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The coordination's topics: the state topic keeps the pause states (compacted, keyed by source
// name: compaction keeps the latest of each for ever), and each source's unit topic stands for the
// source in the group (no records). They are checked at start and while running: a state topic that
// deletes what it holds is refused, one that was deleted or re-created is noticed and given back
// the states this instance knows, and a unit topic that vanished is made again.

// ensureTopics creates the state topic and the unit topics that are missing, and checks an
// existing state topic's cleanup policy (errStateTopic).
func (c *Coordinator) ensureTopics(ctx context.Context, units []string) error {
	cl, err := kgo.NewClient(c.ClientOpts...)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, created, err := c.ensureStateTopic(actx, adm)
	if err != nil {
		return err
	}
	if created && c.LegacyTopic != "" && c.LegacyTopic != c.Topic {
		c.carryOver(actx, cl, adm)
	}
	_, err = c.ensureUnits(actx, adm, units)
	return err
}

// ensureStateTopic creates the state topic (one partition, compacted) or checks the one there, and
// returns its id; created says whether it was made now. The first id it sees is the one Run knows.
func (c *Coordinator) ensureStateTopic(ctx context.Context, adm *kadm.Client) (id kadm.TopicID, created bool, err error) {
	t, err := router.EnsureCompactedTopic(ctx, adm, c.Topic, c.ReplicationFactor)
	switch {
	case err != nil:
		return id, false, fmt.Errorf("fleet coordination: %w", err)
	case t.Missing:
		return id, false, fmt.Errorf("fleet coordination: topic %s does not exist and could not be created: %w", c.Topic, t.Denied)
	case t.Created:
		c.Log.Info("fleet: created the coordination topic", "topic", c.Topic)
	default: // another instance created it, or an earlier run
		if err := c.refuseDeleting(t.Policy); err != nil {
			return id, false, err
		}
	}
	id, created = t.ID, t.Created
	c.mu.Lock()
	if c.stateID == (kadm.TopicID{}) {
		c.stateID = id
	}
	c.mu.Unlock()
	return id, created, nil
}

// checkStatePolicy refuses a state topic whose cleanup policy deletes records (refuseDeleting).
func (c *Coordinator) checkStatePolicy(ctx context.Context, adm *kadm.Client) error {
	policy, _, err := router.TopicPolicy(ctx, adm, c.Topic)
	if err != nil {
		return fmt.Errorf("fleet coordination: %w", err)
	}
	return c.refuseDeleting(policy)
}

// refuseDeleting refuses a state topic's cleanup policy other than compact alone: a pause written
// there would be forgotten after its retention, and a source paused for longer would start again.
func (c *Coordinator) refuseDeleting(policy string) error {
	if policy != router.CleanupCompact {
		return fmt.Errorf("%w: topic %s has cleanup.policy=%s, which deletes its records after retention.ms: the pause states it keeps would be forgotten, and a source paused for longer would start again. "+
			"Set it to compact alone: kafka-configs.sh --bootstrap-server <brokers> --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact (or delete the topic while no instance runs, and let the first one create it)",
			errStateTopic, c.Topic, orNone(policy), c.Topic)
	}
	return nil
}

// orNone is s, or "(none)".
func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// stateTopicID returns the state topic's id (zero when the topic does not exist).
func (c *Coordinator) stateTopicID(ctx context.Context, adm *kadm.Client) (kadm.TopicID, error) {
	details, err := adm.ListTopics(ctx, c.Topic)
	if err != nil {
		return kadm.TopicID{}, fmt.Errorf("fleet coordination: describe topic %s: %w", c.Topic, err)
	}
	d, ok := details[c.Topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return kadm.TopicID{}, nil
	}
	if d.Err != nil {
		return kadm.TopicID{}, fmt.Errorf("fleet coordination: describe topic %s: %w", c.Topic, d.Err)
	}
	return d.ID, nil
}

// ensureUnits creates the unit topics that are missing (one partition each, compacted: they hold no
// records) and returns those it made.
func (c *Coordinator) ensureUnits(ctx context.Context, adm *kadm.Client, units []string) (made []string, err error) {
	if len(units) == 0 {
		return nil, nil
	}
	res, err := adm.CreateTopics(ctx, 1, c.ReplicationFactor, map[string]*string{"cleanup.policy": kadm.StringPtr(router.CleanupCompact)}, units...)
	if err != nil {
		return nil, fmt.Errorf("fleet coordination: create the unit topics: %w", err)
	}
	for _, t := range res.Sorted() {
		switch {
		case t.Err == nil:
			made = append(made, t.Topic)
		case errors.Is(t.Err, kerr.TopicAlreadyExists):
		default:
			return made, fmt.Errorf("fleet coordination: create topic %s: %w", t.Topic, t.Err)
		}
	}
	if len(made) > 0 {
		c.Log.Info("fleet: created unit topics (one per source)", "topics", made)
	}
	return made, nil
}

// carryOver copies the pause states of an earlier release's state topic (LegacyTopic, if it exists)
// into the state topic just created: the latest of each source, by time. A failure is logged: the
// operator can pause again, and says so.
func (c *Coordinator) carryOver(ctx context.Context, cl *kgo.Client, adm *kadm.Client) {
	need, err := router.ToRead(ctx, adm, c.LegacyTopic)
	if err != nil || len(need) == 0 {
		return // no such topic (or unreadable): nothing to carry
	}
	rd, err := kgo.NewClient(append(slices.Clone(c.ClientOpts), kgo.ConsumeTopics(c.LegacyTopic))...)
	if err != nil {
		return
	}
	defer rd.Close()
	latest := map[string]Pause{}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// What could not be read in time is left: the operator can pause again, and is told so below.
	_ = router.ReadToEnd(rctx, rd, c.LegacyTopic, need, func(r *kgo.Record) {
		var p Pause
		if json.Unmarshal(r.Value, &p) == nil && len(r.Key) > 0 && !p.At.Before(latest[string(r.Key)].At) {
			latest[string(r.Key)] = p
		}
	}, router.ReadOptions{})
	var carried []string
	for name, p := range latest {
		if err := c.write(ctx, cl, name, p); err != nil {
			c.Log.Warn("fleet: could not carry a pause state over from the earlier coordination topic; pause the source again if it should stay paused",
				"source", name, "from", c.LegacyTopic, "error", err.Error())
			continue
		}
		if p.Paused {
			carried = append(carried, name)
		}
	}
	if len(latest) > 0 {
		slices.Sort(carried)
		c.Log.Info("fleet: carried the pause states over from the earlier release's coordination topic", "from", c.LegacyTopic, "to", c.Topic, "paused", carried)
	}
}

// watch checks the topics every WatchInterval until ctx ends: a state topic deleted (or deleted and
// created again) is noticed, made again if needed, and given back every pause state this instance
// knows; one whose cleanup policy turned to deleting is reported; a unit topic deleted is made again
// and subscribed anew.
func (c *Coordinator) watch(ctx context.Context, units []string) {
	t := time.NewTicker(c.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.check(ctx, units); err != nil && ctx.Err() == nil {
			c.Log.Warn("fleet: cannot check the coordination topics", "error", err.Error())
		}
	}
}

// check is one round of watch.
func (c *Coordinator) check(ctx context.Context, units []string) error {
	c.mu.Lock()
	control, group, known := c.control, c.group, c.stateID
	c.mu.Unlock()
	if control == nil || group == nil {
		return nil
	}
	adm := kadm.NewClient(control)
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id, err := c.stateTopicID(actx, adm)
	if err != nil {
		return err
	}
	var problem string
	policy := errStateTopic
	if id != (kadm.TopicID{}) {
		policy = c.checkStatePolicy(actx, adm)
		if errors.Is(policy, kerr.UnknownTopicOrPartition) {
			id = kadm.TopicID{} // deleted: the listing came from metadata a moment old
		} else if policy != nil && !errors.Is(policy, errStateTopic) {
			return policy
		}
	}
	switch {
	case id == kadm.TopicID{}:
		problem = "the coordination topic " + c.Topic + " was deleted: it is made again and given back the pause states this instance knows"
		made, _, err := c.ensureStateTopic(actx, adm)
		if err != nil {
			c.setProblem(problem + "; making it failed: " + err.Error())
			return err
		}
		c.restore(actx, control, made, problem)
	case id != known && c.wasStateID(id):
		// A listing a moment old, from before the topic was made again: nothing happened.
	case id != known:
		problem = "the coordination topic " + c.Topic + " was deleted and created again: it is given back the pause states this instance knows"
		c.restore(actx, control, id, problem)
	case errors.Is(policy, errStateTopic):
		problem = policy.Error()
		c.Log.Error("fleet: " + problem)
	}
	c.setProblem(problem)
	// Unit topics that vanished: made again, and subscribed anew (a topic created again has a new id).
	details, err := adm.ListTopics(actx, units...)
	if err != nil {
		return err
	}
	var gone []string
	for _, u := range units {
		if d, ok := details[u]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			gone = append(gone, u)
		}
	}
	// The listing may be a moment old: only the topics made now were really gone.
	made, err := c.ensureUnits(actx, adm, gone)
	if len(made) > 0 {
		c.Log.Warn("fleet: unit topics were deleted and are made again: their sources are assigned anew", "topics", made)
		c.mu.Lock()
		var resubscribe []string
		for _, u := range made {
			if !c.released[u] {
				resubscribe = append(resubscribe, u)
			}
		}
		c.mu.Unlock()
		group.PurgeTopicsFromConsuming(made...)
		group.AddConsumeTopics(resubscribe...)
	}
	return err
}

// restore writes every pause state this instance knows into the state topic, which is now the topic
// with id (made again), and reads that topic anew.
func (c *Coordinator) restore(ctx context.Context, control *kgo.Client, id kadm.TopicID, why string) {
	c.Log.Error("fleet: " + why)
	c.mu.Lock()
	states := make(map[string]Pause, len(c.pauses))
	for name, s := range c.pauses {
		states[name] = s.Pause
	}
	if c.oldIDs == nil {
		c.oldIDs = map[kadm.TopicID]bool{}
	}
	c.oldIDs[c.stateID] = true
	c.stateID = id
	c.mu.Unlock()
	// A topic created again has a new id: the client forgets the old one, for producing and consuming.
	control.PurgeTopicsFromClient(c.Topic)
	control.AddConsumeTopics(c.Topic)
	var failed []string
	for name, p := range states {
		if err := c.write(ctx, control, name, p); err != nil {
			failed = append(failed, name)
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		c.setProblem(why + "; writing back the states of " + strings.Join(failed, ", ") + " failed: pause them again if they should stay paused")
		return
	}
	c.Log.Info("fleet: gave the coordination topic back the pause states this instance knows", "topic", c.Topic, "states", len(states))
}

// wasStateID reports whether id is of a state topic this instance saw before it was made again.
func (c *Coordinator) wasStateID(id kadm.TopicID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.oldIDs[id]
}

// setProblem sets what Problem reports.
func (c *Coordinator) setProblem(p string) {
	c.mu.Lock()
	c.problem = p
	c.mu.Unlock()
}

// Release makes this instance step back from source name for d: its unit topic leaves this member's
// subscription, so that the group gives the source to another instance that lists it (if any), and
// comes back after d. For a cause local to this instance (its configuration, a file it lacks).
func (c *Coordinator) Release(name string, d time.Duration) {
	c.mu.Lock()
	cl := c.group
	m, ok := c.members[name]
	topic := UnitTopic(c.Topic, m)
	if cl == nil || !ok || c.released[topic] {
		c.mu.Unlock()
		return
	}
	c.released[topic] = true
	c.mu.Unlock()
	c.Log.Info("fleet: stepping back from the source so that another instance may take it", "source", name, "for", d.String())
	cl.PurgeTopicsFromConsuming(topic)
	time.AfterFunc(d, func() {
		c.mu.Lock()
		delete(c.released, topic)
		current := c.group == cl
		c.mu.Unlock()
		if current {
			cl.AddConsumeTopics(topic)
		}
	})
}
