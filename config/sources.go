package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"
)

// DefaultSourceName is the name of the one source of a configuration without a sources list (the
// one-source shorthand): the value of the source label of its metrics.
const DefaultSourceName = "default"

// sourceKeys are the top-level keys a sources entry may set besides its name; the others (log,
// metrics, tracing, shutdown_timeout) belong to the process.
var sourceKeys = []string{"postgres", "kafka", "routing", "limits", "tables"}

// sourceNameRE is what a source's name may be: it becomes a metrics label value, a log attribute and
// a path segment of the fleet API.
var sourceNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// Source is one entry of the sources list: a name, and the postgres, kafka, routing and limits keys
// it sets over the top-level ones (which are the defaults of every source).
type Source struct {
	// Name names the source in logs, metrics (the source label), status and the fleet API.
	Name string
	// node is the entry as written, applied over the top-level configuration by resolve.
	node *yaml.Node
}

// UnmarshalYAML implements yaml.Unmarshaler: it keeps the entry to apply it over the top-level keys
// later, and refuses keys a source cannot set.
func (s *Source) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a sources entry must be a mapping (name, postgres, kafka, routing, limits, tables)", n.Line)
	}
	rest := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Value == "name":
			if err := v.Decode(&s.Name); err != nil {
				return fmt.Errorf("line %d: name: %w", v.Line, err)
			}
		case slices.Contains(sourceKeys, k.Value):
			rest.Content = append(rest.Content, k, v)
		default:
			return fmt.Errorf("line %d: %s cannot be set per source (a source sets name, %s; log, metrics, tracing, fleet and shutdown_timeout belong to the process)",
				k.Line, k.Value, strings.Join(sourceKeys, ", "))
		}
	}
	s.node = rest
	return nil
}

// MarshalYAML implements yaml.Marshaler: the entry as written.
func (s Source) MarshalYAML() (any, error) {
	out := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "name"}, &yaml.Node{Kind: yaml.ScalarNode, Value: s.Name})
	if s.node != nil {
		out.Content = append(out.Content, s.node.Content...)
	}
	return out, nil
}

// keys returns the dotted keys the entry sets (postgres, postgres.url, ...).
func (s Source) keys() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, n *yaml.Node)
	walk = func(prefix string, n *yaml.Node) {
		if n == nil || n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := prefix + n.Content[i].Value
			keys[key] = true
			walk(key+".", n.Content[i+1])
		}
	}
	walk("", s.node)
	return keys
}

// secrets feeds add the entry's secrets as written, whether or not it is valid: its PostgreSQL URLs
// and its SASL password.
func (s Source) secrets(add func(string)) {
	if s.node == nil {
		return
	}
	var raw struct {
		Postgres struct {
			URL         any   `yaml:"url"`
			StandbyURLs []any `yaml:"standby_urls"`
		} `yaml:"postgres"`
		Kafka struct {
			SASL struct {
				Password any `yaml:"password"`
			} `yaml:"sasl"`
		} `yaml:"kafka"`
	}
	_ = s.node.Decode(&raw) // what cannot be decoded has no string to hide
	str := func(v any) string {
		if v == nil {
			return ""
		}
		return fmt.Sprint(v)
	}
	urlSecrets(str(raw.Postgres.URL), add)
	for _, u := range raw.Postgres.StandbyURLs {
		urlSecrets(str(u), add)
	}
	if p := str(raw.Kafka.SASL.Password); p != "" {
		add(p)
	}
}

// Sources returns the configuration of every source, each whole (the top-level keys with the
// source's own over them) and named: the sources list, or the top-level configuration alone named
// DefaultSourceName. Valid after Load.
func (c *Config) Sources() []Config {
	if len(c.resolved) > 0 {
		return c.resolved
	}
	one := *c
	one.Name = DefaultSourceName
	return []Config{one}
}

// HasSources reports whether the configuration has a sources list.
func (c *Config) HasSources() bool { return len(c.SourceList) > 0 }

// Source returns the configuration of the source named name.
func (c *Config) Source(name string) (Config, error) {
	var names []string
	for _, s := range c.Sources() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Config{}, fmt.Errorf("no source is named %q (the sources are %s)", name, strings.Join(names, ", "))
}

// clone returns a copy of c that shares no map or slice with it.
func (c *Config) clone() Config {
	out := *c
	out.Postgres.StandbyURLs = slices.Clone(c.Postgres.StandbyURLs)
	out.Kafka.Brokers = slices.Clone(c.Kafka.Brokers)
	out.Kafka.TopicConfig = maps.Clone(c.Kafka.TopicConfig)
	out.Routing.Topics = maps.Clone(c.Routing.Topics)
	out.Routing.AllowedTopics = slices.Clone(c.Routing.AllowedTopics)
	out.Tables = slices.Clone(c.Tables)
	out.SourceList = nil
	out.resolved = nil
	return out
}

// processKeys are the key prefixes that belong to the process, not to a source: validated once.
var processKeys = []string{"log.", "metrics.", "tracing.", "fleet.", "shutdown_timeout"}

// resolveSources builds and validates the configuration of every entry of the sources list over c
// (before format defaults): explicit reports the keys the file, environment and flags set at the
// top level. Every problem is returned, each naming the source and the key.
func (c *Config) resolveSources(explicit func(key string) bool) error {
	var errs []error
	processBad := map[string]bool{}
	seenName := map[string]int{}
	type place struct{ target, name string }
	slots := map[place]string{}
	publications := map[place]struct{ source, table string }{}
	tables := map[place]string{}
	for i, s := range c.SourceList {
		label := fmt.Sprintf("sources[%d]", i)
		if s.Name != "" {
			label += " (" + s.Name + ")"
		}
		switch {
		case s.Name == "":
			errs = append(errs, fmt.Errorf("%s: name: is required", label))
		case !sourceNameRE.MatchString(s.Name):
			errs = append(errs, fmt.Errorf("%s: name: must be lower-case letters, digits, '_', '.' and '-' (at most 63, starting with a letter or digit), got %q", label, s.Name))
		default:
			if j, dup := seenName[s.Name]; dup {
				errs = append(errs, fmt.Errorf("%s: name: %q is also the name of sources[%d]", label, s.Name, j))
			}
			seenName[s.Name] = i
		}
		sc := c.clone()
		if s.node != nil && len(s.node.Content) > 0 {
			data, err := yaml.Marshal(s.node)
			if err == nil {
				dec := yaml.NewDecoder(bytes.NewReader(data))
				dec.KnownFields(true)
				if err = dec.Decode(&sc); errors.Is(err, io.EOF) {
					err = nil
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", label, err))
				continue
			}
		}
		own := s.keys()
		sc.ApplyFormatDefaults(func(key string) bool { return own[key] || explicit(key) })
		sc.Name, sc.filesLater = s.Name, true
		if err := sc.applyPasswordFile(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
		}
		sc.validate(func(key, format string, args ...any) {
			msg := fmt.Sprintf("%s: %s", key, fmt.Sprintf(format, args...))
			for _, p := range processKeys {
				if strings.HasPrefix(key, p) {
					if !processBad[msg] {
						processBad[msg] = true
						errs = append(errs, errors.New(msg))
					}
					return
				}
			}
			errs = append(errs, fmt.Errorf("%s: %s", label, msg))
		})
		// Two sources on one database: their slots and publications must be theirs alone.
		if target := databaseOf(sc.Postgres.URL); target != "" {
			at := place{target, sc.Postgres.Slot}
			if other, dup := slots[at]; dup {
				errs = append(errs, fmt.Errorf("%s: postgres.slot: %q is also the slot of source %s on the same database (a slot streams to one reader: give each source its own)", label, sc.Postgres.Slot, other))
			} else {
				slots[at] = s.Name
			}
			at = place{target, sc.Postgres.Publication}
			if other, dup := publications[at]; dup && other.table != sc.Postgres.Table {
				errs = append(errs, fmt.Errorf("%s: postgres.publication: %q is also the publication of source %s (table %s) on the same database: each would stream the other's table; give each source its own publication",
					label, sc.Postgres.Publication, other.source, other.table))
			} else if !dup {
				publications[at] = struct{ source, table string }{s.Name, sc.Postgres.Table}
			}
			for _, prefix := range sc.Postgres.MessagePrefixes {
				// Every slot of a database decodes every message: two sources reading one prefix
				// would each send it.
				at = place{target, "message prefix " + prefix}
				if other, dup := tables[at]; dup && other != s.Name {
					errs = append(errs, fmt.Errorf("%s: postgres.message_prefixes: %q is also a prefix of source %s on the same database: every message would be sent twice", label, prefix, other))
				} else if !dup {
					tables[at] = s.Name
				}
			}
			for j, t := range append([]string{sc.Postgres.Table}, tableNames(sc.Tables)...) {
				key := "postgres.table"
				if j > 0 {
					key = fmt.Sprintf("tables[%d].table", j-1)
				}
				if t == "" {
					continue // a source of WAL messages only
				}
				at = place{target, qualifiedTable(t)}
				if other, dup := tables[at]; dup && other != s.Name {
					errs = append(errs, fmt.Errorf("%s: %s: %s is also a table of source %s on the same database: every event would be sent twice", label, key, t, other))
				} else if !dup {
					tables[at] = s.Name
				}
			}
		}
		c.resolved = append(c.resolved, sc)
	}
	if c.Fleet.Coordination == FleetKafka && len(c.Kafka.Brokers) == 0 {
		errs = append(errs, errors.New("kafka.brokers: the instances of a sources list coordinate through the top-level kafka settings: set kafka.brokers at the top level (or fleet.coordination: none)"))
	}
	return errors.Join(errs...)
}

// tableNames returns the names of the tables list.
func tableNames(tables []Table) []string {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.Name
	}
	return names
}

// DefaultGroup is fleet.group's default: the consumer group of the instances that share a sources
// list, whatever the list holds, so that a change of the list keeps one group (and its pause states).
// Fleets that share a Kafka cluster give each its own.
const DefaultGroup = "outbox-cdc"

// GroupID is the consumer group the instances of this sources list share: fleet.group, DefaultGroup
// when it is not set.
func (c *Config) GroupID() string {
	if c.Fleet.Group != "" {
		return c.Fleet.Group
	}
	return DefaultGroup
}

// CoordinationTopic is the fleet's state topic: outbox-cdc.fleet.<group>.
func (c *Config) CoordinationTopic() string { return "outbox-cdc.fleet." + c.GroupID() }

// LegacyCoordinationTopic is the state topic releases before 2026-12-08 used when fleet.group was not
// set (the group outbox-cdc-fleet- and a hash of every source's name, database and slot), whose pause
// states an upgrade carries over into a state topic it creates — also one named by fleet.group now,
// as the Helm chart does since.
func (c *Config) LegacyCoordinationTopic() string {
	var ids []string
	for _, s := range c.Sources() {
		ids = append(ids, s.Name+"@"+databaseOf(s.Postgres.URL)+"/"+s.Postgres.Slot)
	}
	slices.Sort(ids)
	sum := sha256.Sum256([]byte(strings.Join(ids, "\n")))
	return "outbox-cdc.fleet.outbox-cdc-fleet-" + hex.EncodeToString(sum[:6])
}

// SourceIdentity is what the source streams, for the fleet's unit of assignment: its database's name
// and its slot ("orders/orders_slot"). The host is left out, so that a host string changed in a
// rolling update keeps the source's unit.
func (c *Config) SourceIdentity() string {
	db := ""
	if pc, err := pgconn.ParseConfig(c.Postgres.URL); err == nil {
		db = pc.Database
	}
	return db + "/" + c.Postgres.Slot
}

// databaseOf identifies the database a PostgreSQL URL connects to (host:port/database), or "" when
// it cannot be parsed (validation says so).
func databaseOf(u string) string {
	pc, err := pgconn.ParseConfig(u)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
}
