package router

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// mapRow is a Row backed by a map; a missing key is NULL.
type mapRow map[string]string

func (m mapRow) Value(col string) ([]byte, bool) {
	v, ok := m[col]
	if !ok {
		return nil, false
	}
	return []byte(v), true
}

var defaultCols = config.Columns{
	EventID: "event_id", EventType: "event_type", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
	AggregateVersion: "aggregate_version", Payload: "payload", Headers: "headers", CreatedAt: "created_at",
}

func TestRulesTopic(t *testing.T) {
	base := mapRow{"event_type": "OrderPaid", "aggregate_type": "order", "aggregate_id": "42", "tenant": "acme"}
	tests := []struct {
		name     string
		template string
		topics   map[string]string
		fallback string
		row      mapRow
		want     string
		wantErr  string
	}{
		{"default template", "{event_type}", nil, "", base, "OrderPaid", ""},
		{"prefix and aggregate type", "outbox.{aggregate_type}", nil, "", base, "outbox.order", ""},
		{"any column", "{tenant}.{event_type}", nil, "", base, "acme.OrderPaid", ""},
		{"explicit map wins", "{event_type}", map[string]string{"OrderPaid": "payments"}, "", base, "payments", ""},
		{"null template column, fallback", "{aggregate_type}.x", nil, "misc", mapRow{"event_type": "A"}, "misc", ""},
		{"null template column, no fallback", "{aggregate_type}.x", nil, "", mapRow{"event_type": "A"}, "", "aggregate_type is NULL"},
		{"invalid name, fallback", "{event_type}", nil, "misc", mapRow{"event_type": "bad name"}, "misc", ""},
		{"invalid name, no fallback", "{event_type}", nil, "", mapRow{"event_type": "bad/name"}, "", "not a valid Kafka topic"},
		{"too long", "{event_type}", nil, "", mapRow{"event_type": strings.Repeat("a", 250)}, "", "not a valid Kafka topic"},
		{"null event type", "{event_type}", nil, "misc", mapRow{}, "", "event type) is NULL or empty"},
		{"empty event type", "{event_type}", nil, "misc", mapRow{"event_type": ""}, "", "event type) is NULL or empty"},
		{"dot-dot", "{event_type}", nil, "", mapRow{"event_type": ".."}, "", "not a valid Kafka topic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRules(config.Routing{Topic: tt.template, Topics: tt.topics, FallbackTopic: tt.fallback}, defaultCols)
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Topic(tt.row)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %q, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestRulesUseConfiguredColumnNames(t *testing.T) {
	cols := defaultCols
	cols.EventType = "kind"
	r, err := NewRules(config.Routing{Topic: "{event_type}"}, cols)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Topic(mapRow{"kind": "Shipped"}); err != nil || got != "Shipped" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestNewRulesNamesTheKey: every topic named in advance must be a valid Kafka topic name (and match
// the allow-list), and each error names its configuration key.
func TestNewRulesNamesTheKey(t *testing.T) {
	tests := []struct {
		routing config.Routing
		key     string
	}{
		{config.Routing{Topic: "{event_type}", Topics: map[string]string{"X": "a b"}}, "routing.topics.X"},
		{config.Routing{Topic: "{event_type}", DLQTopic: "no/slash"}, "routing.dlq_topic"},
		{config.Routing{Topic: "{event_type}", FallbackTopic: "__consumer_offsets"}, "routing.fallback_topic"},
		{config.Routing{Topic: "{event_type}", AllowedTopics: []string{"[oops"}}, "routing.allowed_topics"},
		{config.Routing{Topic: "{event_type}", AllowedTopics: []string{"orders.*"}, FallbackTopic: "misc"}, "routing.fallback_topic"},
		{config.Routing{Topic: "{}"}, "routing.topic"},
	}
	for _, tt := range tests {
		if _, err := NewRules(tt.routing, defaultCols); err == nil || !strings.HasPrefix(err.Error(), tt.key+":") {
			t.Errorf("%+v: error %v, want one naming %s", tt.routing, err, tt.key)
		}
	}
}

func TestNewRulesRejectsBadTemplates(t *testing.T) {
	for _, tmpl := range []string{"{}", "a.{event_type", "a}b"} {
		if _, err := NewRules(config.Routing{Topic: tmpl}, defaultCols); err == nil {
			t.Errorf("template %q accepted", tmpl)
		}
	}
	if _, err := NewRules(config.Routing{Topic: "{event_type}", Topics: map[string]string{"X": "bad topic"}}, defaultCols); err == nil {
		t.Error("invalid mapped topic accepted")
	}
}

// TestTopicIsAlwaysValidOrUnroutable: whatever the column values, a routed topic is a valid name.
func TestTopicIsAlwaysValidOrUnroutable(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	alphabet := []rune("abcXYZ019._-/ {}ü")
	r, err := NewRules(config.Routing{Topic: "pre.{event_type}.{aggregate_type}"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	randStr := func() string {
		n := rng.IntN(140)
		b := make([]rune, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	for i := 0; i < 20000; i++ {
		row := mapRow{"event_type": randStr(), "aggregate_type": randStr()}
		topic, err := r.Topic(row)
		if err == nil && !outbox.ValidTopic(topic) {
			t.Fatalf("row %v routed to invalid topic %q", row, topic)
		}
		if err != nil && topic != "" {
			t.Fatalf("unroutable row returned topic %q", topic)
		}
	}
}

// TestReservedTopicIsNeverRouted: a row whose template makes the checkpoint topic (or a name Kafka
// takes for it: '.' and '_' collide) is undeliverable with the reason, fallback or not.
func TestReservedTopicIsNeverRouted(t *testing.T) {
	r, err := NewRules(config.Routing{Topic: "outbox-cdc.{event_type}", FallbackTopic: "fallback"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	r.Reserve("outbox-cdc.checkpoints", "kafka.checkpoint_topic")
	for _, et := range []string{"checkpoints"} {
		_, err := r.Topic(mapRow{"event_type": et})
		var u *undeliverable
		if !errors.As(err, &u) || !strings.Contains(u.reason, "kafka.checkpoint_topic") {
			t.Errorf("event type %q: %v, want undeliverable naming kafka.checkpoint_topic", et, err)
		}
	}
	collide, err := NewRules(config.Routing{Topic: "outbox-cdc_{event_type}"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	collide.Reserve("outbox-cdc.checkpoints", "kafka.checkpoint_topic")
	if _, err := collide.Topic(mapRow{"event_type": "checkpoints"}); err == nil {
		t.Error("a topic colliding with the checkpoint topic was routed")
	}
	if topic, err := r.Topic(mapRow{"event_type": "OrderPaid"}); err != nil || topic != "outbox-cdc.OrderPaid" {
		t.Errorf("an ordinary row went to %q (%v)", topic, err)
	}
}

// TestConstantTemplateIsCheckedAtStart: a template without a placeholder is one topic for every row:
// one Kafka refuses, or the allow-list excludes, is a configuration error naming routing.topic.
func TestConstantTemplateIsCheckedAtStart(t *testing.T) {
	for _, tt := range []struct {
		routing config.Routing
		want    string
	}{
		{config.Routing{Topic: "bad/name"}, "routing.topic"},
		{config.Routing{Topic: "__internal"}, "routing.topic"},
		{config.Routing{Topic: "orders", AllowedTopics: []string{"events.*"}}, "routing.allowed_topics"},
	} {
		if _, err := NewRules(tt.routing, defaultCols); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("template %q: %v, want an error naming %s", tt.routing.Topic, err, tt.want)
		}
	}
	if _, err := NewRules(config.Routing{Topic: "orders.all"}, defaultCols); err != nil {
		t.Errorf("a valid constant template refused: %v", err)
	}
}

// TestConstantTemplateIsResolvedOnce: a template without placeholders is one topic: it is checked
// (name, allow-list, reserved topics) on its first row and cached, and a refused one stays refused on
// every row, the cache notwithstanding.
func TestConstantTemplateIsResolvedOnce(t *testing.T) {
	r, err := NewRules(config.Routing{Topic: "orders.all"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if topic, err := r.Topic(mapRow{"event_type": "OrderPaid" + strings.Repeat("x", i)}); err != nil || topic != "orders.all" {
			t.Fatalf("row %d went to %q (%v), want orders.all", i, topic, err)
		}
	}
	if got, ok := r.resolved[""]; !ok || got != "orders.all" || len(r.resolved) != 1 {
		t.Errorf("the constant template's topic is not cached once: %v", r.resolved)
	}

	refused, err := NewRules(config.Routing{Topic: "outbox-cdc.checkpoints"}, defaultCols)
	if err != nil {
		t.Fatal(err)
	}
	refused.Reserve("outbox-cdc_checkpoints", "kafka.checkpoint_topic")
	for i := range 3 {
		var u *undeliverable
		if _, err := refused.Topic(mapRow{"event_type": "OrderPaid"}); !errors.As(err, &u) || !strings.Contains(u.reason, "kafka.checkpoint_topic") {
			t.Errorf("row %d to a reserved constant topic: %v, want undeliverable naming kafka.checkpoint_topic", i, err)
		}
	}
}

// TestEventTypesAreInterned: the event type kept with a prepared record (its metrics label) is one
// string per event type, equal to the row's, and the interning table starts over past its bound.
func TestEventTypesAreInterned(t *testing.T) {
	var r Router
	a, b := r.eventType([]byte("OrderPaid")), r.eventType([]byte("OrderPaid"))
	if a != "OrderPaid" || b != "OrderPaid" {
		t.Fatalf("event types %q, %q, want OrderPaid", a, b)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = r.eventType([]byte("OrderPaid")) }); allocs != 0 {
		t.Errorf("an event type seen before costs %v allocations, want 0", allocs)
	}
	for i := range 2 * maxResolved {
		if got, want := r.eventType([]byte(strings.Repeat("x", i%50)+string(rune('a'+i%26))+strconv.Itoa(i))), strings.Repeat("x", i%50)+string(rune('a'+i%26))+strconv.Itoa(i); got != want {
			t.Fatalf("event type %q came back as %q", want, got)
		}
	}
	if len(r.types) > maxResolved {
		t.Errorf("%d interned event types, want at most %d", len(r.types), maxResolved)
	}
}
