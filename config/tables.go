package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Table is one entry of the tables list: a further outbox table of the source's database, streamed
// through the source's slot and publication (one decode of the WAL for all of them), with its own
// routing over the source's.
type Table struct {
	// Name is the table, schema-qualified like postgres.table.
	Name string
	// routing is the entry's routing as written, applied over the source's by OutboxTables.
	routing *yaml.Node
}

// UnmarshalYAML implements yaml.Unmarshaler: it keeps the routing to apply it over the source's, and
// refuses keys a table cannot set.
func (t *Table) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a tables entry must be a mapping (table, routing)", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "table":
			if err := v.Decode(&t.Name); err != nil {
				return fmt.Errorf("line %d: table: %w", v.Line, err)
			}
		case "routing":
			t.routing = v
		default:
			return fmt.Errorf("line %d: %s cannot be set per table (a tables entry sets table and routing; the columns, format, dead-letter topic, slot and publication are the source's)", k.Line, k.Value)
		}
	}
	return nil
}

// MarshalYAML implements yaml.Marshaler: the entry as written.
func (t Table) MarshalYAML() (any, error) {
	out := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "table"}, &yaml.Node{Kind: yaml.ScalarNode, Value: t.Name})
	if t.routing != nil {
		out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "routing"}, t.routing)
	}
	return out, nil
}

// OutboxTable is one outbox table of a source with the routing of its rows.
type OutboxTable struct {
	// Table is schema-qualified or not, as configured.
	Table string
	// Routing is the table's: the source's routing with the entry's own keys over it.
	Routing Routing
}

// OutboxTables returns the source's outbox tables: postgres.table with the source's routing first,
// then each entry of the tables list with its routing over the source's. They share the source's
// slot, publication, columns, format and dead-letter topic.
func (c *Config) OutboxTables() ([]OutboxTable, error) {
	out := []OutboxTable{{Table: c.Postgres.Table, Routing: c.Routing}}
	var errs []error
	for i, t := range c.Tables {
		// Over a copy, as a source's keys go over the top-level ones (a topics map adds to the source's).
		r := c.Routing
		r.Topics = maps.Clone(c.Routing.Topics)
		r.AllowedTopics = slices.Clone(c.Routing.AllowedTopics)
		if t.routing != nil {
			data, err := yaml.Marshal(t.routing)
			if err == nil {
				dec := yaml.NewDecoder(bytes.NewReader(data))
				dec.KnownFields(true)
				if err = dec.Decode(&r); errors.Is(err, io.EOF) {
					err = nil
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("tables[%d].routing: %w", i, err))
				continue
			}
		}
		out = append(out, OutboxTable{Table: t.Name, Routing: r})
	}
	return out, errors.Join(errs...)
}

// qualifiedTable is schema.table, public when the name has no schema.
func qualifiedTable(name string) string {
	if strings.Contains(name, ".") {
		return name
	}
	return "public." + name
}

// validateTables reports the problems of the tables list to bad: a name that is not a table, a table
// listed twice (or equal to postgres.table), a routing that cannot route, or a dead-letter topic of
// its own (the dead-letter topic is the source's).
func (c *Config) validateTables(bad func(key, format string, args ...any)) {
	if len(c.Tables) == 0 {
		return
	}
	tables, err := c.OutboxTables()
	if err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			key, msg, _ := strings.Cut(e, ": ")
			bad(key, "%s", msg)
		}
		return
	}
	seen := map[string]int{qualifiedTable(c.Postgres.Table): -1}
	for i, t := range c.Tables {
		key := fmt.Sprintf("tables[%d]", i)
		if parts := strings.Split(t.Name, "."); len(parts) > 2 || t.Name == "" || parts[0] == "" || parts[len(parts)-1] == "" {
			bad(key+".table", "must be table or schema.table, got %q", t.Name)
			continue
		}
		if j, dup := seen[qualifiedTable(t.Name)]; dup {
			other := "postgres.table"
			if j >= 0 {
				other = fmt.Sprintf("tables[%d].table", j)
			}
			bad(key+".table", "%s is also %s: every event would be sent twice", t.Name, other)
		}
		seen[qualifiedTable(t.Name)] = i
	}
	for i, t := range tables[1:] {
		key := fmt.Sprintf("tables[%d].routing", i)
		if t.Routing.DLQTopic != c.Routing.DLQTopic {
			bad(key+".dlq_topic", "a table cannot have a dead-letter topic of its own: the source's routing.dlq_topic (%q) takes every table's undeliverable rows", c.Routing.DLQTopic)
		}
		if t.Routing.Topic == "" && len(t.Routing.Topics) == 0 && t.Routing.FallbackTopic == "" {
			bad(key+".topic", "is empty and neither topics nor fallback_topic is set: no row of %s could be routed", t.Table)
		}
		if cp := c.Kafka.CheckpointTopic; cp != "" {
			same := func(t string) bool {
				return t != "" && strings.ReplaceAll(t, ".", "_") == strings.ReplaceAll(cp, ".", "_")
			}
			if same(t.Routing.FallbackTopic) || (!strings.ContainsAny(t.Routing.Topic, "{}") && same(t.Routing.Topic)) {
				bad(key, "routes to kafka.checkpoint_topic (%q), which holds the exactly-once checkpoints of every slot: no record may go there", cp)
			}
			for et, tp := range t.Routing.Topics {
				if same(tp) {
					bad(key+".topics."+et, "is kafka.checkpoint_topic (%q), which holds the exactly-once checkpoints of every slot: no record may go there", cp)
				}
			}
		}
	}
}

// SplitTable splits "schema.table" (or "table", schema public) into its parts: the one reading of a
// configured table name.
func SplitTable(qualified string) (schema, table string) {
	if i := strings.IndexByte(qualified, '.'); i >= 0 {
		return qualified[:i], qualified[i+1:]
	}
	return "public", qualified
}

// sameTable reports whether two configured names name one table ("outbox" is "public.outbox").
func sameTable(a, b string) bool {
	as, at := SplitTable(a)
	bs, bt := SplitTable(b)
	return as == bs && at == bt
}
