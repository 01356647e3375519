// Package router is outbox-cdc's only conversation with Kafka: it turns outbox rows into records and
// delivers them — chooses each row's topic, builds key, value and headers, produces with franz-go,
// sends rows that can never be delivered to the dead-letter topic with their reason — and its Admin
// lists and creates topics for the operator commands. It knows nothing of the WAL format.
package router

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// Row is one outbox row: the value of a column by name, false when NULL or absent.
type Row interface {
	Value(column string) ([]byte, bool)
}

// roles maps the role names usable in a topic template to their configured columns.
func roles(c config.Columns) map[string]string {
	return map[string]string{
		"event_id": c.EventID, "event_type": c.EventType, "aggregate_type": c.AggregateType,
		"aggregate_id": c.AggregateID, "aggregate_version": c.AggregateVersion, "created_at": c.CreatedAt,
	}
}

// Rules choose a row's topic: an explicit event_type -> topic map first, then the template, then the
// fallback topic for rows the template cannot route. An allow-list, when set, bounds the topics the
// template may produce: anyone who can insert into the outbox could otherwise have the router create
// any number of topics.
type Rules struct {
	parts    []templatePart
	topics   map[string]string
	fallback string
	allowed  []string
	cols     config.Columns
	// reserved are topics no row may go to (the checkpoint topic), with why.
	reserved map[string]string

	// resolved caches the topics a template with one column made, valid and allowed, by that
	// column's value: the template, the name check and the allowed patterns run once per event type,
	// not once per row. A template without columns (one fixed topic) is cached under "". Bounded by
	// maxResolved.
	mu       sync.Mutex
	resolved map[string]string
	single   string // the template's only column (singleColumn), set once by NewRules
	constant bool   // the template reads no column, set once by NewRules
}

// maxResolved bounds Rules.resolved; past it the cache starts over.
const maxResolved = 4096

type templatePart struct {
	literal string
	column  string // non-empty for a {placeholder}
}

var placeholderRE = regexp.MustCompile(`\{([^{}]*)\}`)

// NewRules compiles the routing section of the configuration. In the template (routing.topic),
// {name} is replaced by the row's value of column name; the role names event_type, aggregate_type,
// aggregate_id, ... stand for their configured columns. routing.allowed_topics, when not empty, lists
// the glob patterns (path.Match: *, ?, [...]) a template's topic must match; the fallback topic and
// the topics map must match them too. Every topic named in advance (map, fallback, dead-letter topic)
// must be a valid Kafka topic name. Errors name the configuration key.
func NewRules(routing config.Routing, cols config.Columns) (*Rules, error) {
	template, topics, fallback, allowed := routing.Topic, routing.Topics, routing.FallbackTopic, routing.AllowedTopics
	r := &Rules{topics: topics, fallback: fallback, allowed: allowed, cols: cols}
	for _, pattern := range allowed {
		if _, err := path.Match(pattern, ""); err != nil || pattern == "" {
			return nil, fmt.Errorf("routing.allowed_topics: %q is not a glob pattern (*, ?, [...])", pattern)
		}
	}
	if fallback != "" && !outbox.ValidTopic(fallback) {
		return nil, fmt.Errorf("routing.fallback_topic: %q is not a valid Kafka topic name", fallback)
	}
	if fallback != "" && !r.Allowed(fallback) {
		return nil, fmt.Errorf("routing.fallback_topic: %q matches no pattern of routing.allowed_topics", fallback)
	}
	if routing.DLQTopic != "" && !outbox.ValidTopic(routing.DLQTopic) {
		return nil, fmt.Errorf("routing.dlq_topic: %q is not a valid Kafka topic name", routing.DLQTopic)
	}
	for et, t := range topics {
		if !outbox.ValidTopic(t) {
			return nil, fmt.Errorf("routing.topics.%s: %q is not a valid Kafka topic name", et, t)
		}
		if !r.Allowed(t) {
			return nil, fmt.Errorf("routing.topics.%s: %q matches no pattern of routing.allowed_topics", et, t)
		}
	}
	roles := roles(cols)
	last := 0
	for _, m := range placeholderRE.FindAllStringSubmatchIndex(template, -1) {
		if m[0] > last {
			r.parts = append(r.parts, templatePart{literal: template[last:m[0]]})
		}
		name := strings.TrimSpace(template[m[2]:m[3]])
		if name == "" {
			return nil, fmt.Errorf("routing.topic: template %q has an empty placeholder", template)
		}
		if col, ok := roles[name]; ok && col != "" {
			name = col
		}
		r.parts = append(r.parts, templatePart{column: name})
		last = m[1]
	}
	if rest := template[last:]; rest != "" {
		if strings.ContainsAny(rest, "{}") {
			return nil, fmt.Errorf("routing.topic: template %q has an unbalanced brace", template)
		}
		r.parts = append(r.parts, templatePart{literal: rest})
	}
	if template != "" && len(r.TemplateColumns()) == 0 {
		// A constant: every row would go to this one topic, so Kafka's rules apply now.
		if !outbox.ValidTopic(template) {
			return nil, fmt.Errorf("routing.topic: %q has no {placeholder} and is not a valid Kafka topic name (1-249 of [a-zA-Z0-9._-], not starting with __)", template)
		}
		if !r.Allowed(template) {
			return nil, fmt.Errorf("routing.topic: %q matches no pattern of routing.allowed_topics", template)
		}
	}
	r.single = r.singleColumn()
	r.constant = len(r.parts) > 0 && len(r.TemplateColumns()) == 0
	return r, nil
}

// Reserve keeps every row out of topic (and out of any topic Kafka would take for it: '.' and '_'
// collide), naming what it is in the reason a row routed there is dead-lettered with. Call it before
// the rules are used.
func (r *Rules) Reserve(topic, what string) {
	if topic == "" {
		return
	}
	if r.reserved == nil {
		r.reserved = make(map[string]string)
	}
	r.reserved[collisionName(topic)] = what
}

// collisionName is the name Kafka compares topics by: '.' and '_' are the same to it.
func collisionName(topic string) string { return strings.ReplaceAll(topic, ".", "_") }

// refused says why no row may go to topic, or "".
func (r *Rules) refused(topic string) string {
	if what, ok := r.reserved[collisionName(topic)]; ok {
		return fmt.Sprintf("topic %q is %s: rows are never routed there", truncate(topic, 300), what)
	}
	return ""
}

// undeliverable says why a row can never be delivered (no topic, no key, too large, ...): such a row
// goes to the dead-letter topic with this reason, or becomes an UndeliverableError without one.
type undeliverable struct {
	reason string
}

// Error implements error.
func (u *undeliverable) Error() string { return u.reason }

// Topic returns the topic for row, or an *undeliverable error.
func (r *Rules) Topic(row Row) (string, error) {
	et, ok := row.Value(r.cols.EventType)
	if !ok || len(et) == 0 {
		return "", &undeliverable{reason: fmt.Sprintf("column %s (event type) is NULL or empty", r.cols.EventType)}
	}
	if t, ok := r.topics[string(et)]; ok {
		return t, nil // a reserved topic cannot be in the map (config.Validate)
	}
	if len(r.parts) == 0 {
		return r.orFallback(fmt.Sprintf("no routing.topics entry for event type %q and no topic template", et))
	}
	column := r.single
	cached := column != "" || r.constant
	var cacheKey []byte
	if cached {
		if column != "" {
			cacheKey, _ = row.Value(column)
		}
		r.mu.Lock()
		t, ok := r.resolved[string(cacheKey)]
		r.mu.Unlock()
		if ok {
			return t, nil
		}
	}
	var b strings.Builder
	for _, p := range r.parts {
		if p.column == "" {
			b.WriteString(p.literal)
			continue
		}
		v, ok := row.Value(p.column)
		if !ok || len(v) == 0 {
			return r.orFallback(fmt.Sprintf("topic template: column %s is NULL or empty", p.column))
		}
		b.Write(v)
	}
	topic := b.String()
	if !outbox.ValidTopic(topic) {
		return r.orFallback(fmt.Sprintf("topic %q is not a valid Kafka topic name (1-249 of [a-zA-Z0-9._-], not starting with __, which Kafka keeps for itself)", truncate(topic, 300)))
	}
	if !r.Allowed(topic) {
		return "", &undeliverable{reason: fmt.Sprintf("topic %q matches no pattern of routing.allowed_topics", topic)}
	}
	if why := r.refused(topic); why != "" {
		return "", &undeliverable{reason: why}
	}
	if cached {
		r.mu.Lock()
		if r.resolved == nil || len(r.resolved) >= maxResolved {
			r.resolved = make(map[string]string)
		}
		r.resolved[string(cacheKey)] = topic
		r.mu.Unlock()
	}
	return topic, nil
}

// Allowed reports whether topic matches the allow-list (always, when it is empty).
func (r *Rules) Allowed(topic string) bool {
	if len(r.allowed) == 0 {
		return true
	}
	for _, pattern := range r.allowed {
		if ok, _ := path.Match(pattern, topic); ok {
			return true
		}
	}
	return false
}

// singleColumn is the template's column when it has exactly one (around literals); empty otherwise.
func (r *Rules) singleColumn() string {
	column := ""
	for _, p := range r.parts {
		if p.column != "" {
			if column != "" {
				return ""
			}
			column = p.column
		}
	}
	return column
}

// TemplateColumns are the columns the topic template reads, as configured (role names resolved).
func (r *Rules) TemplateColumns() []string {
	var out []string
	for _, p := range r.parts {
		if p.column != "" && !slices.Contains(out, p.column) {
			out = append(out, p.column)
		}
	}
	return out
}

func (r *Rules) orFallback(reason string) (string, error) {
	if r.fallback != "" {
		return r.fallback, nil
	}
	return "", &undeliverable{reason: reason}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
