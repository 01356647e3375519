package ops

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// ACL is one Kafka ACL a configuration needs: operations allowed on a resource, named literally or by
// prefix. The names are those kafka-acls.sh takes.
type ACL struct {
	// Resource is topic, transactional-id, group or cluster.
	Resource string
	// Name is the resource's name, or its prefix when Prefixed; "*" for every resource of the kind.
	Name     string
	Prefixed bool
	// Operations are Kafka's operation names (Write, Describe, DescribeConfigs, Read, Create).
	Operations []string
	// Why says what the router does with it.
	Why string
}

// TopicPrefix is the literal start of a topic template ("orders." of "orders.{event_type}"), and
// whether the template has a placeholder at all.
func TopicPrefix(template string) (prefix string, templated bool) {
	i := strings.IndexByte(template, '{')
	if i < 0 {
		return template, false
	}
	return template[:i], true
}

// KafkaACLs returns the ACLs the principal of cfg (one source, or a sources list) needs for what
// the configuration makes the router do: write its topics (by the templates' literal prefixes),
// create them when kafka.create_topics is on, and in the exactly-once mode its transactional ids
// and checkpoint topic; with a sources list and fleet coordination, the coordination's topics and
// group.
func KafkaACLs(cfg config.Config) []ACL {
	produce := []string{"Write", "Describe", "DescribeConfigs"}
	var out []ACL
	seen := map[string]bool{}
	add := func(a ACL) {
		key := fmt.Sprint(a.Resource, a.Name, a.Prefixed, a.Operations)
		if !seen[key] {
			seen[key] = true
			out = append(out, a)
		}
	}
	sources := []config.Config{cfg}
	if cfg.HasSources() {
		sources = cfg.Sources()
	}
	for _, s := range sources {
		ops := produce
		if s.Kafka.CreateTopics {
			ops = append(slices.Clone(produce), "Create")
		}
		routings := []config.Routing{s.Routing}
		if tables, err := s.OutboxTables(); err == nil { // validated with the configuration
			for _, t := range tables[1:] {
				routings = append(routings, t.Routing)
			}
		}
		for _, r := range routings {
			if r.Topic != "" {
				prefix, templated := TopicPrefix(r.Topic)
				switch {
				case !templated:
					add(ACL{Resource: "topic", Name: prefix, Operations: ops, Why: "routing.topic"})
				case prefix == "":
					add(ACL{Resource: "topic", Name: "*", Operations: ops, Why: "routing.topic " + r.Topic + " may name any topic: give it a literal prefix to narrow this"})
				default:
					add(ACL{Resource: "topic", Name: prefix, Prefixed: true, Operations: ops, Why: "routing.topic " + r.Topic})
				}
			}
			for _, t := range KnownTopics(s) {
				add(ACL{Resource: "topic", Name: t, Operations: ops, Why: "routing.topics, fallback_topic, dlq_topic"})
			}
		}
		if s.Kafka.ExactlyOnce() {
			add(ACL{Resource: "transactional-id", Name: "outbox-cdc-", Prefixed: true, Operations: []string{"Write", "Describe"},
				Why: "exactly-once: the slots' transactional ids (outbox-cdc-<system id>-<database>-<slot>)"})
			cp := []string{"Read", "Write", "Describe", "DescribeConfigs"}
			if s.Kafka.CreateTopics {
				cp = append(cp, "Create")
			}
			add(ACL{Resource: "topic", Name: s.Kafka.CheckpointTopic, Operations: cp, Why: "exactly-once: kafka.checkpoint_topic"})
		}
	}
	if cfg.HasSources() && cfg.Fleet.Coordination == config.FleetKafka {
		add(ACL{Resource: "topic", Name: cfg.CoordinationTopic(), Prefixed: true, Operations: []string{"Create", "Describe", "DescribeConfigs", "Read", "Write"},
			Why: "fleet: the coordination's state and unit topics"})
		add(ACL{Resource: "group", Name: cfg.GroupID(), Operations: []string{"Read", "Describe"}, Why: "fleet: the consumer group that shares the sources"})
	}
	return out
}

// PrintACLs writes the ACLs cfg needs as kafka-acls.sh commands for principal (User:<name>).
func PrintACLs(w io.Writer, cfg config.Config, principal string) {
	fmt.Fprintf(w, "Kafka ACLs this configuration needs (delivery %s; principal %s):\n", deliveryOf(cfg), principal)
	for _, a := range KafkaACLs(cfg) {
		res := "--" + a.Resource + " '" + a.Name + "'"
		if a.Resource == "cluster" {
			res = "--cluster"
		}
		pattern := ""
		if a.Prefixed {
			pattern = " --resource-pattern-type prefixed"
		}
		var ops []string
		for _, o := range a.Operations {
			ops = append(ops, "--operation "+o)
		}
		fmt.Fprintf(w, "  kafka-acls.sh --bootstrap-server <brokers> --add --allow-principal %s %s%s %s   # %s\n", principal, res, pattern, strings.Join(ops, " "), a.Why)
	}
}

// deliveryOf names the delivery modes of cfg's sources.
func deliveryOf(cfg config.Config) string {
	if !cfg.HasSources() {
		return cfg.Kafka.Delivery
	}
	var modes []string
	for _, s := range cfg.Sources() {
		if !slices.Contains(modes, s.Kafka.Delivery) {
			modes = append(modes, s.Kafka.Delivery)
		}
	}
	return strings.Join(modes, ", ")
}
