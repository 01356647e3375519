package config

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadYAML(t *testing.T, doc string, environ map[string]string) (Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path, env(environ), nil)
}

func TestSourcesResolveOverTopLevel(t *testing.T) {
	cfg, err := loadYAML(t, `
kafka:
  brokers: ["127.0.0.1:59092"]
  topic_config: {retention.ms: "1000"}
sources:
  - name: s1
    postgres: {url: "postgres://u:pw1@127.0.0.1:55432/db1", table: public.outbox, slot: s1, publication: outbox_cdc}
    routing: {topic: "orders.{event_type}"}
  - name: s7
    postgres: {url: "postgres://u:pw2@127.0.0.1:55432/db6", table: public.outbox_b, slot: s7, publication: pub_b}
    routing: {topic: "billing.{event_type}"}
    kafka: {delivery: exactly-once, topic_config: {cleanup.policy: compact}}
  - name: dbz
    postgres: {url: "postgres://u@127.0.0.1:55432/db6", slot: dbz, publication: pub_dbz}
    kafka: {header_format: debezium}
`, map[string]string{"OUTBOX_CDC_LINGER": "3ms"})
	if err != nil {
		t.Fatal(err)
	}
	srcs := cfg.Sources()
	if len(srcs) != 3 {
		t.Fatalf("got %d sources, want 3", len(srcs))
	}
	s1, s7, dbz := srcs[0], srcs[1], srcs[2]
	checks := []struct {
		what      string
		got, want any
	}{
		{"names", []string{s1.Name, s7.Name, dbz.Name}, []string{"s1", "s7", "dbz"}},
		{"s1 routing", s1.Routing.Topic, "orders.{event_type}"},
		{"s7 table", s7.Postgres.Table, "public.outbox_b"},
		{"brokers inherited", s7.Kafka.Brokers, []string{"127.0.0.1:59092"}},
		{"environment is a default of every source", s1.Kafka.Linger.String(), "3ms"},
		{"s1 keeps the default delivery", s1.Kafka.Delivery, DeliveryAtLeastOnce},
		{"s7 sets its own delivery", s7.Kafka.Delivery, DeliveryExactlyOnce},
		{"s7's topic_config merges over the top level's", s7.Kafka.TopicConfig, map[string]string{"retention.ms": "1000", "cleanup.policy": "compact"}},
		{"s1's topic_config is not s7's", s1.Kafka.TopicConfig, map[string]string{"retention.ms": "1000"}},
		{"the debezium source gets Debezium's columns", dbz.Postgres.Columns.EventID, "id"},
		{"the debezium source gets Debezium's topic", dbz.Routing.Topic, DebeziumTopic},
		{"the others keep the outbox columns", s1.Postgres.Columns.EventID, "event_id"},
		{"the debezium source keeps the default table", dbz.Postgres.Table, "public.outbox"},
	}
	for _, c := range checks {
		if !equalAny(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if _, err := cfg.Source("s7"); err != nil {
		t.Error(err)
	}
	if _, err := cfg.Source("nope"); err == nil || !strings.Contains(err.Error(), "s1, s7, dbz") {
		t.Errorf("Source(nope): %v, want an error listing the sources", err)
	}
	secrets := strings.Join(cfg.Secrets(), "\n")
	for _, pw := range []string{"pw1", "pw2"} {
		if !strings.Contains(secrets, pw) {
			t.Errorf("Secrets() misses a source's password %s", pw)
		}
	}
}

func equalAny(a, b any) bool {
	switch x := a.(type) {
	case []string:
		return slices.Equal(x, b.([]string))
	case map[string]string:
		y := b.(map[string]string)
		if len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if y[k] != v {
				return false
			}
		}
		return true
	}
	return a == b
}

func TestOneSourceShorthand(t *testing.T) {
	cfg, err := loadYAML(t, "postgres: {url: \"postgres://u@h/db\"}\nkafka: {brokers: [\"h:9092\"]}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	srcs := cfg.Sources()
	if len(srcs) != 1 || srcs[0].Name != DefaultSourceName || srcs[0].Postgres.URL != "postgres://u@h/db" || cfg.HasSources() {
		t.Fatalf("shorthand: got %+v", srcs)
	}
}

func TestSourcesValidationNamesSourceAndKey(t *testing.T) {
	const head = "kafka: {brokers: [\"h:9092\"]}\nsources:\n"
	tests := []struct {
		name, entries string
		want          []string
	}{
		{"missing name", `  - postgres: {url: "postgres://u@h/db1"}`, []string{"sources[0]: name: is required"}},
		{"bad name", `  - {name: "Bad Name", postgres: {url: "postgres://u@h/db1"}}`, []string{`sources[0] (Bad Name): name: must be`}},
		{"duplicate name", "  - {name: a, postgres: {url: \"postgres://u@h/db1\"}}\n  - {name: a, postgres: {url: \"postgres://u@h/db2\"}}",
			[]string{`sources[1] (a): name: "a" is also the name of sources[0]`}},
		{"missing url", "  - {name: a, postgres: {table: public.x}}", []string{"sources[0] (a): postgres.url: is required"}},
		{"bad key of a source", "  - {name: a, postgres: {url: \"postgres://u@h/db1\", tabel: x}}", []string{"sources[0] (a):", "tabel"}},
		{"process key in a source", "  - {name: a, log: {level: debug}}", []string{"log cannot be set per source"}},
		{"one slot twice on one database", "  - {name: a, postgres: {url: \"postgres://u@h/db1\", table: public.a, publication: pa}}\n  - {name: b, postgres: {url: \"postgres://v@h:5432/db1\", table: public.b, publication: pb}}",
			[]string{`sources[1] (b): postgres.slot: "outbox_cdc" is also the slot of source a`}},
		{"one publication for two tables", "  - {name: a, postgres: {url: \"postgres://u@h/db1\", table: public.a, slot: a}}\n  - {name: b, postgres: {url: \"postgres://u@h/db1\", table: public.b, slot: b}}",
			[]string{`sources[1] (b): postgres.publication: "outbox_cdc" is also the publication of source a (table public.a)`}},
		{"one table twice", "  - {name: a, postgres: {url: \"postgres://u@h/db1\", slot: a}}\n  - {name: b, postgres: {url: \"postgres://u@h/db1\", slot: b}}",
			[]string{`sources[1] (b): postgres.table: public.outbox is also a table of source a`}},
		{"one message prefix twice on one database", "  - {name: a, postgres: {url: \"postgres://u@h/db1\", table: \"\", slot: a, publication: pa, message_prefixes: [outbox]}}\n  - {name: b, postgres: {url: \"postgres://u@h/db1\", table: \"\", slot: b, publication: pb, message_prefixes: [billing, outbox]}}",
			[]string{`sources[1] (b): postgres.message_prefixes: "outbox" is also a prefix of source a`}},
		{"a source's own invalid value", "  - {name: a, postgres: {url: \"postgres://u@h/db1\"}, kafka: {delivery: twice}}", []string{`sources[0] (a): kafka.delivery: must be`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, head+tt.entries+"\n", nil)
			if err == nil {
				t.Fatal("loaded; want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestSourcesProcessKeyErrorOnce(t *testing.T) {
	_, err := loadYAML(t, `
kafka: {brokers: ["h:9092"]}
log: {level: loud}
sources:
  - {name: a, postgres: {url: "postgres://u@h/db1"}}
  - {name: b, postgres: {url: "postgres://u@h/db2"}}
`, nil)
	if err == nil || strings.Count(err.Error(), "log.level") != 1 || strings.Contains(err.Error(), "(a): log.level") {
		t.Fatalf("error %v: want log.level named once, without a source", err)
	}
}

func TestSourcesSecretsOfAnInvalidEntry(t *testing.T) {
	// A source that fails validation still has its password hidden by the caller's scrubber.
	cfg, err := loadYAML(t, `
kafka: {brokers: ["h:9092"]}
sources:
  - {name: a, postgres: {url: "postgres://u:s3cr3t-pw@h/db1", slot: "Not Valid"}, kafka: {sasl: {password: sasl-pw-9}}}
`, nil)
	if err == nil {
		t.Fatal("loaded; want an error")
	}
	secrets := strings.Join(cfg.Secrets(), "\n")
	for _, pw := range []string{"s3cr3t-pw", "sasl-pw-9"} {
		if !strings.Contains(secrets, pw) {
			t.Errorf("Secrets() of a failed load misses %s", pw)
		}
	}
}

// TestExampleFleetLoads keeps testdata/fleet.yaml (docs/fleet.md's example) loadable.
func TestExampleFleetLoads(t *testing.T) {
	cfg, err := Load("../testdata/fleet.yaml", env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if srcs := cfg.Sources(); len(srcs) != 3 || srcs[2].Routing.Topic != DebeziumTopic || srcs[1].Kafka.Delivery != DeliveryExactlyOnce {
		t.Fatalf("testdata/fleet.yaml: got %d sources", len(srcs))
	}
}

// TestGroupID: the instances share one group whatever their sources lists hold (a change of the list
// keeps the group and its state); fleet.group overrides it and must be a topic-name fragment. The
// earlier releases' group, named after the list, is known for the upgrade's carry-over, and a source's
// identity leaves the host out.
func TestGroupID(t *testing.T) {
	load := func(doc string) *Config {
		t.Helper()
		c, err := loadYAML(t, doc, nil)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	const a = "  - {name: a, postgres: {url: \"postgres://u@h/db1\"}}\n"
	const b = "  - {name: b, postgres: {url: \"postgres://u@h/db2\"}}\n"
	const head = "kafka: {brokers: [\"h:9092\"]}\nsources:\n"
	ab, ba, aOnly := load(head+a+b).GroupID(), load(head+b+a).GroupID(), load(head+a).GroupID()
	if ab != ba || ab != aOnly || ab != DefaultGroup {
		t.Errorf("group ids %q, %q, %q: want %q whatever the list", ab, ba, aOnly, DefaultGroup)
	}
	if c := load(head + a + b); c.CoordinationTopic() != "outbox-cdc.fleet.outbox-cdc" {
		t.Errorf("coordination topic %q", c.CoordinationTopic())
	}
	lab, lba, laOnly := load(head+a+b).LegacyCoordinationTopic(), load(head+b+a).LegacyCoordinationTopic(), load(head+a).LegacyCoordinationTopic()
	if lab != lba || lab == laOnly || !strings.HasPrefix(lab, "outbox-cdc.fleet.outbox-cdc-fleet-") {
		t.Errorf("legacy topics %q, %q, %q: want the earlier releases' one per list", lab, lba, laOnly)
	}
	if g := load("fleet: {group: payments}\n" + head + a); g.GroupID() != "payments" || g.LegacyCoordinationTopic() != laOnly {
		t.Errorf("fleet.group: got %q (legacy %q): the earlier release's topic is carried over whatever the group is now", g.GroupID(), g.LegacyCoordinationTopic())
	}
	hostA := load(head + "  - {name: a, postgres: {url: \"postgres://u@h1:5432/db1\", slot: s1}}\n").Sources()[0]
	hostB := load(head + "  - {name: a, postgres: {url: \"postgres://u@h2:6432/db1\", slot: s1}}\n").Sources()[0]
	other := load(head + "  - {name: a, postgres: {url: \"postgres://u@h1:5432/db1\", slot: s2}}\n").Sources()[0]
	if hostA.SourceIdentity() != "db1/s1" || hostA.SourceIdentity() != hostB.SourceIdentity() || other.SourceIdentity() == hostA.SourceIdentity() {
		t.Errorf("identities %q, %q, %q: want the database and slot, not the host", hostA.SourceIdentity(), hostB.SourceIdentity(), other.SourceIdentity())
	}
	if _, err := loadYAML(t, "fleet: {group: \"bad group/x\"}\n"+head+a, nil); err == nil || !strings.Contains(err.Error(), "fleet.group") {
		t.Errorf("a group id that cannot name a topic: %v", err)
	}
	if _, err := loadYAML(t, "sources:\n"+a, nil); err == nil || !strings.Contains(err.Error(), "set kafka.brokers at the top level") {
		t.Errorf("coordination without top-level brokers: %v", err)
	}
}

// TestPasswordFile: each source's password comes from its own file (a mounted Secret), goes into its
// URL and is a secret; a URL that holds one already, or a missing file, is refused naming the key.
func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := write("a", "p@ss:w/rd\n"), write("b", "other-secret")
	cfg, err := loadYAML(t, `
kafka: {brokers: ["h:9092"]}
sources:
  - {name: a, postgres: {url: "postgres://ua@h/db1", password_file: `+a+`}}
  - {name: b, postgres: {url: "postgres://ub@h/db2", password_file: `+b+`}}
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	srcs := cfg.Sources()
	for i, want := range []string{"p@ss:w/rd", "other-secret"} {
		u, err := url.Parse(srcs[i].Postgres.URL)
		if err != nil {
			t.Fatal(err)
		}
		if pw, _ := u.User.Password(); pw != want {
			t.Errorf("source %s: password %q from its file, want %q", srcs[i].Name, pw, want)
		}
		if !slices.Contains(cfg.Secrets(), want) {
			t.Errorf("Secrets() lacks the password of %s's file", srcs[i].Name)
		}
	}
	for name, doc := range map[string]string{
		"URL with a password": "  - {name: a, postgres: {url: \"postgres://ua:inline@h/db1\", password_file: " + a + "}}",
		"missing file":        "  - {name: a, postgres: {url: \"postgres://ua@h/db1\", password_file: " + filepath.Join(dir, "nope") + "}}",
	} {
		if _, err := loadYAML(t, "kafka: {brokers: [\"h:9092\"]}\nsources:\n"+doc+"\n", nil); err == nil || !strings.Contains(err.Error(), "sources[0] (a): postgres.password_file") {
			t.Errorf("%s: %v, want an error naming sources[0] (a): postgres.password_file", name, err)
		}
	}
}

// TestSourceTLSFilesMayComeLater: a TLS file a source's configuration names that does not exist yet
// (a Secret mounted late) does not refuse a sources list — the source waits for it while the others
// stream — but still refuses the one-source configuration at start, naming the key.
func TestSourceTLSFilesMayComeLater(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "not-yet", "ca.pem")
	url := "postgres://u@h/db1?sslmode=verify-full&sslrootcert=" + missing
	doc := "kafka: {brokers: [\"h:9092\"]}\nsources:\n  - {name: a, postgres: {url: \"" + url + "\"}}\n  - {name: b, postgres: {url: \"postgres://u@h/db2\"}, kafka: {tls: {enabled: true, ca_file: \"" + missing + "\"}}}\n"
	if _, err := loadYAML(t, doc, nil); err != nil {
		t.Fatalf("a sources list whose TLS files are not there yet: %v", err)
	}
	if _, err := loadYAML(t, "kafka: {brokers: [\"h:9092\"]}\npostgres: {url: \""+url+"\"}\n", nil); err == nil || !strings.Contains(err.Error(), "postgres.url") {
		t.Errorf("the one-source configuration with a missing sslrootcert: %v, want a refusal naming postgres.url", err)
	}
	if _, err := loadYAML(t, "kafka: {brokers: [\"h:9092\"], tls: {enabled: true, ca_file: \""+missing+"\"}}\npostgres: {url: \"postgres://u@h/db\"}\n", nil); err == nil || !strings.Contains(err.Error(), "kafka.tls.ca_file") {
		t.Errorf("the one-source configuration with a missing CA file: %v, want a refusal naming kafka.tls.ca_file", err)
	}
}
