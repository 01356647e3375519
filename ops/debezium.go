package ops

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// Conversion is what FromDebezium made of a Debezium connector's configuration: the outbox-cdc
// configuration file that writes the same records from the same slot, and what could not be
// carried over.
type Conversion struct {
	// YAML is the configuration file.
	YAML []byte
	// Notes say what was not carried over or must be added by hand, one line each.
	Notes []string
	// Blocking is true when outbox-cdc cannot take over as configured (another decoding plugin,
	// no outbox EventRouter): the notes say why.
	Blocking bool
}

// debeziumDefaults are the EventRouter's and the PostgreSQL connector's defaults for the options the
// conversion reads.
var debeziumDefaults = map[string]string{
	"table.field.event.id":      "id",
	"table.field.event.key":     "aggregateid",
	"table.field.event.payload": "payload",
	"route.by.field":            "aggregatetype",
	"route.topic.regex":         "(?<routedByValue>.*)",
	"route.topic.replacement":   "outbox.event.${routedByValue}",
}

// irrelevant are connector options that change nothing for outbox-cdc (it never snapshots, keeps
// no offsets of its own and confirms the slot itself).
var irrelevant = []string{
	"name", "connector.class", "tasks.max", "topic.prefix", "database.server.name", "snapshot.mode",
	"tombstones.on.delete", "slot.drop.on.stop", "publication.autocreate.mode", "database.password",
	"heartbeat.interval.ms", "heartbeat.action.query", "offset.flush.interval.ms", "poll.interval.ms",
	"max.batch.size", "max.queue.size", "schema.include.list", "transforms", "provide.transaction.metadata",
	"errors.tolerance", "errors.log.enable", "errors.log.include.messages", "slot.stream.params",
	"database.initial.statements", "skipped.operations", "topic.creation.enable", "publication.autocreate.mode",
}

// eventRouterOptions are the EventRouter's options the conversion reads (under the transform's
// prefix): any other option there is one it cannot tell the meaning of — a typo, a newer option, a
// predicate — and the conversion refuses rather than write a configuration that behaves otherwise.
var eventRouterOptions = []string{
	"type", "table.field.event.id", "table.field.event.key", "table.field.event.payload", "table.field.event.timestamp",
	"route.by.field", "route.topic.regex", "route.topic.replacement", "table.fields.additional.placement",
	"table.expand.json.payload", "route.tombstone.on.empty.payload", "tracing.span.context.field",
	"table.field.event.schema.version", "debezium.op.invalid.behavior", "table.json.payload.null.behavior",
	"tracing.operation.name", "tracing.with.context.field.only", "table.fields.additional.error.on.missing",
}

// ParseDebeziumConfig reads a connector's configuration: the JSON Kafka Connect's REST API takes or
// returns ({"name": ..., "config": {...}}, or the config object alone), or a .properties file.
func ParseDebeziumConfig(data []byte) (map[string]string, error) {
	trimmed := bytes.TrimSpace(data)
	if bytes.HasPrefix(trimmed, []byte("{")) {
		var doc map[string]any
		if err := json.Unmarshal(trimmed, &doc); err != nil {
			return nil, fmt.Errorf("read the connector's JSON: %w", err)
		}
		if inner, ok := doc["config"].(map[string]any); ok {
			if name, ok := doc["name"].(string); ok {
				if _, has := inner["name"]; !has {
					inner["name"] = name
				}
			}
			doc = inner
		}
		props := map[string]string{}
		for k, v := range doc {
			switch t := v.(type) {
			case string:
				props[k] = t
			case nil:
			default:
				b, _ := json.Marshal(t)
				props[k] = string(b)
			}
		}
		return props, nil
	}
	props := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			k, v, ok = strings.Cut(line, ":")
		}
		if !ok {
			return nil, fmt.Errorf("read the connector's properties: %q is not key=value", line)
		}
		props[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return props, sc.Err()
}

// decodeMessageContent is the transform with which Debezium's PostgreSQL connector turns WAL
// messages into change events for the EventRouter.
const decodeMessageContent = "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent"

// FromDebezium converts a Debezium PostgreSQL connector's configuration with the outbox EventRouter
// into outbox-cdc's: the same database, slot and publication (so that outbox-cdc resumes where the
// connector stopped), the same table columns, topics, converters and EventRouter options, in
// kafka.header_format debezium and at-least-once delivery. The brokers and the password are never
// in a connector's configuration worth copying: the notes say to add them.
func FromDebezium(props map[string]string) Conversion {
	var c Conversion
	note := func(format string, args ...any) { c.Notes = append(c.Notes, fmt.Sprintf(format, args...)) }
	used := map[string]bool{}
	get := func(key string) (string, bool) {
		used[key] = true
		v, ok := props[key]
		return v, ok
	}
	if cls, _ := get("connector.class"); cls != "io.debezium.connector.postgresql.PostgresConnector" {
		note("connector.class is %q, not io.debezium.connector.postgresql.PostgresConnector: outbox-cdc takes over from Debezium's PostgreSQL connector only", cls)
		c.Blocking = true
	}
	if plugin, ok := get("plugin.name"); ok && plugin != "pgoutput" {
		note("plugin.name is %q: outbox-cdc reads pgoutput, so it cannot use this slot; create a new one (outbox-cdc init) after the connector has delivered everything, and republish what it had not with outbox-cdc resync", plugin)
		c.Blocking = true
	}

	pg := map[string]any{}
	var more []map[string]any // further outbox tables (the tables list)
	kafka := map[string]any{"brokers": []string{"CHANGE-ME:9092"}, "delivery": config.DeliveryAtLeastOnce, "header_format": config.HeaderFormatDebezium}
	routing := map[string]any{}
	host, _ := get("database.hostname")
	port, _ := get("database.port")
	if port == "" {
		port = "5432"
	}
	user, _ := get("database.user")
	db, _ := get("database.dbname")
	u := url.URL{Scheme: "postgres", Host: net.JoinHostPort(host, port), Path: "/" + db}
	if user != "" {
		u.User = url.User(user)
	}
	if mode, ok := get("database.sslmode"); ok && mode != "" {
		u.RawQuery = url.Values{"sslmode": {mode}}.Encode()
	}
	if host == "" || db == "" {
		note("database.hostname or database.dbname is missing: fix postgres.url")
	}
	pg["url"] = u.String()
	if _, ok := props["database.password"]; ok {
		note("the password is not copied: give it as PGPASSWORD (or in postgres.url)")
	}
	slot, ok := get("slot.name")
	if !ok || slot == "" {
		slot = "debezium"
	}
	pub, ok := get("publication.name")
	if !ok || pub == "" {
		pub = "dbz_publication"
	}
	pg["slot"], pg["publication"], pg["create_slot"] = slot, pub, false
	tables, _ := get("table.include.list")
	if tables == "" {
		tables, _ = get("table.whitelist")
	}
	list := splitList(tables)
	plain := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$`)
	// A connector that relays WAL messages (DecodeLogicalDecodingMessageContent before the
	// EventRouter) reads the prefixes of message.prefix.include.list: postgres.message_prefixes.
	messages := false
	transforms, _ := get("transforms")
	for _, name := range splitList(transforms) {
		if typ := props["transforms."+name+".type"]; typ == decodeMessageContent {
			messages = true
		}
	}
	if messages {
		include, _ := get("message.prefix.include.list")
		prefixes := splitList(include)
		literal := regexp.MustCompile(`^[A-Za-z0-9_\-:/]+$`)
		switch {
		case len(prefixes) == 0:
			note("message.prefix.include.list is empty: the connector relays messages of every prefix, and outbox-cdc reads named prefixes only (postgres.message_prefixes); name them and convert again")
			c.Blocking = true
		case slices.ContainsFunc(prefixes, func(p string) bool { return !literal.MatchString(p) }):
			note("message.prefix.include.list %q holds patterns (regular expressions) that outbox-cdc cannot match: name each prefix and convert again", include)
			c.Blocking = true
		default:
			pg["message_prefixes"] = prefixes
		}
		if _, ok := get("message.prefix.exclude.list"); ok {
			note("message.prefix.exclude.list is not carried over: postgres.message_prefixes names the prefixes read")
		}
	}
	switch {
	case len(list) == 0 && messages:
		pg["table"] = "" // a source of WAL messages only
		note("table.include.list is empty: a source of WAL messages only (postgres.table empty); the connector's publication must carry no table, " +
			"or list the tables it carries under postgres.ignore_tables")
	case len(list) == 0:
		note("table.include.list is empty: the connector captures every table of its publication, and outbox-cdc streams named outbox tables only; name them in table.include.list (schema.table) and convert again")
		c.Blocking = true
	case slices.ContainsFunc(list, func(t string) bool { return !plain.MatchString(t) }):
		note("table.include.list %q holds patterns (regular expressions) that outbox-cdc cannot match: name each outbox table as schema.table and convert again", tables)
		c.Blocking = true
	default:
		// The first is postgres.table; the others become the tables list, each with the source's
		// routing, as the connector routes every captured table alike.
		pg["table"] = list[0]
		for _, t := range list[1:] {
			more = append(more, map[string]any{"table": t})
		}
	}
	// The connector captures only its include list, whatever its publication carries: Debezium
	// creates it FOR ALL TABLES by default (publication.autocreate.mode all_tables), and one that was
	// made by hand (disabled) may carry others. outbox-cdc refuses other tables unless told to
	// ignore them, so the conversion says so; a filtered publication holds the list exactly.
	if mode, _ := get("publication.autocreate.mode"); mode != "filtered" {
		pg["ignore_tables"] = []string{"*"}
		note("postgres.ignore_tables: [\"*\"]: the connector's publication (publication.autocreate.mode %s) may carry tables beside the outbox, whose rows the connector ignores; "+
			"once it carries the outbox tables only (ALTER PUBLICATION ... SET TABLE ...), remove the key so that a table joining it is noticed", orDefault(mode, "all_tables, the default"))
	}

	prefix := ""
	for _, name := range splitList(transforms) {
		typ, _ := get("transforms." + name + ".type")
		if typ == "io.debezium.transforms.outbox.EventRouter" && prefix == "" {
			prefix = "transforms." + name + "."
			continue
		}
		if typ == decodeMessageContent {
			continue // postgres.message_prefixes, above
		}
		note("transform %s (%s) is not carried over", name, typ)
	}
	if prefix == "" {
		note("no io.debezium.transforms.outbox.EventRouter among the transforms: this connector does not relay an outbox")
		c.Blocking = true
	}
	router := func(key string) string {
		v, ok := get(prefix + key)
		if !ok {
			return debeziumDefaults[key]
		}
		return v
	}
	cols := map[string]any{}
	dbz := config.DebeziumColumns()
	for key, col := range map[string]struct {
		name string
		def  string
	}{
		"table.field.event.id": {"event_id", dbz.EventID}, "table.field.event.key": {"aggregate_id", dbz.AggregateID},
		"table.field.event.payload": {"payload", dbz.Payload},
	} {
		if v := router(key); v != col.def {
			cols[col.name] = v
		}
	}
	if ts := router("table.field.event.timestamp"); ts != "" {
		cols["timestamp"] = ts
	}
	by := router("route.by.field")
	if by != dbz.AggregateType {
		cols["aggregate_type"] = by
	}
	regex, replacement := router("route.topic.regex"), router("route.topic.replacement")
	switch {
	case regex != debeziumDefaults["route.topic.regex"]:
		note("%sroute.topic.regex %q cannot be carried over: routing.topic builds topic names from whole column values ({column}) and routing.topics maps event types to topics; "+
			"write the routing by hand (or remove the option) and convert again", prefix, regex)
		c.Blocking = true
	case strings.Count(replacement, "$") != strings.Count(replacement, "${routedByValue}"):
		note("%sroute.topic.replacement %q refers to groups other than routedByValue, which cannot be carried over: write routing.topic by hand and convert again", prefix, replacement)
		c.Blocking = true
	default:
		topic := strings.ReplaceAll(replacement, "${routedByValue}", "{aggregate_type}")
		if topic != config.DebeziumTopic {
			routing["topic"] = topic
		}
	}
	d := map[string]any{}
	if v := router("table.fields.additional.placement"); v != "" {
		d["additional_placement"] = v
	}
	if v := router("table.expand.json.payload"); v == "true" {
		d["expand_json_payload"] = true
	}
	if v := router("route.tombstone.on.empty.payload"); v == "true" {
		d["tombstone_on_empty_payload"] = true
	}
	if v := router("tracing.span.context.field"); v != "" {
		cols["trace_context"] = v
	} else {
		note("tracing: Debezium propagates the trace context of a tracingspancontext column only with OpenTelemetry on the worker's classpath; if yours has it, set postgres.columns.trace_context: tracingspancontext")
	}
	if v := router("table.field.event.schema.version"); v != "" {
		note("table.field.event.schema.version (%s) is not supported: the value schema's version exists only with a schema-carrying converter", v)
	}
	if v := router("debezium.op.invalid.behavior"); v == "fatal" {
		note("debezium.op.invalid.behavior fatal is not carried over: outbox-cdc ignores (and counts) updates of the outbox")
	}
	if v := router("table.json.payload.null.behavior"); v != "" && v != "ignore" {
		note("table.json.payload.null.behavior %s is not supported: null members of an expanded payload are left out", v)
	}
	if v := router("table.fields.additional.error.on.missing"); v == "false" {
		note("table.fields.additional.error.on.missing false: outbox-cdc leaves a NULL additional field out, as the connector does then")
	}
	var foreign []string
	for k := range props {
		if !strings.HasPrefix(k, prefix) || prefix == "" {
			continue
		}
		used[k] = true
		if !slices.Contains(eventRouterOptions, strings.TrimPrefix(k, prefix)) {
			foreign = append(foreign, k)
		}
	}
	sort.Strings(foreign)
	for _, k := range foreign {
		note("%s is not an EventRouter option outbox-cdc knows (a typo, a newer option, or a predicate that would change which records are routed): remove it or carry its effect over by hand, and convert again", k)
		c.Blocking = true
	}

	converter, why := converterOf(props, used)
	if why != "" {
		note("%s", why)
	}
	if converter != config.DebeziumConverterString {
		d["converter"] = converter
	}
	if (d["expand_json_payload"] != nil || strings.Contains(router("table.fields.additional.placement"), ":envelope")) && converter != config.DebeziumConverterJSON {
		note("expanded payloads and envelope fields need kafka.debezium.converter json (JsonConverter with schemas.enable=false)")
	}
	if n, ok := get("topic.creation.default.partitions"); ok {
		if v, err := strconv.Atoi(n); err == nil && v > 0 {
			kafka["topic_partitions"] = v
		} else if n != "-1" { // -1: the broker's default, which outbox-cdc takes too
			note("topic.creation.default.partitions %q is not a partition count; kafka.topic_partitions keeps its default", n)
		}
	}
	if n, ok := get("topic.creation.default.replication.factor"); ok {
		if v, err := strconv.Atoi(n); err == nil && v > 0 {
			kafka["topic_replication_factor"] = v
		} else if n != "-1" {
			note("topic.creation.default.replication.factor %q is not a replication factor; kafka.topic_replication_factor keeps its default (-1, the broker's)", n)
		}
	}
	if len(d) > 0 {
		kafka["debezium"] = d
	}
	if len(cols) > 0 {
		pg["columns"] = cols
	}
	note("kafka.brokers is the Kafka Connect worker's bootstrap.servers, which the connector's configuration does not hold: set it")
	var unknown []string
	for k := range props {
		if !used[k] && !slices.Contains(irrelevant, k) && !strings.HasPrefix(k, "transforms.") && !strings.HasPrefix(k, "topic.creation.") {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		note("%s is not carried over", k)
	}
	doc := map[string]any{"postgres": pg, "kafka": kafka}
	if len(more) > 0 {
		doc["tables"] = more
	}
	if len(routing) > 0 {
		doc["routing"] = routing
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		note("cannot write the configuration: %v", err)
		c.Blocking = true
		return c
	}
	header := "# outbox-cdc configuration converted from Debezium connector " + quoteName(props["name"]) + " by `outbox-cdc from-debezium`.\n" +
		"# It streams from the connector's slot and publication: stop the connector first (see docs/debezium.md).\n"
	c.YAML = append([]byte(header), out...)
	return c
}

// converterOf reads the connector's key and value converters: the debezium format's converter, and
// why it may not match when it cannot tell or the converters cannot be matched.
func converterOf(props map[string]string, used map[string]bool) (string, string) {
	kind := func(which string) (string, string) {
		used[which+".converter"], used[which+".converter.schemas.enable"] = true, true
		cls, ok := props[which+".converter"]
		switch {
		case !ok:
			return "", ""
		case cls == "org.apache.kafka.connect.storage.StringConverter":
			return config.DebeziumConverterString, ""
		case cls == "org.apache.kafka.connect.json.JsonConverter":
			if props[which+".converter.schemas.enable"] != "false" {
				return "", which + ".converter is JsonConverter with schemas (schemas.enable defaults to true): outbox-cdc writes JsonConverter's output with schemas.enable=false only"
			}
			return config.DebeziumConverterJSON, ""
		default:
			return "", fmt.Sprintf("%s.converter %s is not supported: outbox-cdc matches StringConverter and JsonConverter (schemas.enable=false)", which, cls)
		}
	}
	key, whyKey := kind("key")
	value, whyValue := kind("value")
	switch {
	case whyKey != "" || whyValue != "":
		return config.DebeziumConverterString, strings.TrimSpace(whyKey + " " + whyValue)
	case key == "" && value == "":
		return config.DebeziumConverterString, "the connector names no converters, so the worker's key.converter and value.converter apply: StringConverter assumed; set kafka.debezium.converter json if the worker uses JsonConverter with schemas.enable=false"
	case key != "" && value != "" && key != value:
		return value, fmt.Sprintf("the key converter (%s) and the value converter (%s) differ: outbox-cdc uses one for both (%s taken)", key, value, value)
	case value == "":
		return key, "no value.converter: the worker's applies; the key converter's kind assumed for both"
	case key == "":
		return value, "no key.converter: the worker's applies; the value converter's kind assumed for both"
	}
	return value, ""
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// orDefault is s, or def when s is empty.
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// DebeziumSecretKey reports whether a connector option may hold a secret, so that its value is kept
// out of everything from-debezium prints: passwords, JAAS configurations, secrets, tokens,
// credentials and private key material (ssl.key, sslkey, a private or API key). An option that merely
// ends in ".key" and names a column or a converter (table.field.event.key, key.converter) is not one.
func DebeziumSecretKey(key string) bool {
	l := strings.ToLower(key)
	for _, word := range []string{"password", "passwd", "jaas", "secret", "token", "credential", "passphrase", "sslkey"} {
		if strings.Contains(l, word) {
			return true
		}
	}
	parts := strings.Split(l, ".")
	if n := len(parts); n >= 2 && parts[n-1] == "key" {
		switch parts[n-2] {
		case "ssl", "private", "api", "access", "signing", "encryption", "client":
			return true
		}
	}
	return false
}

// quoteName quotes a connector name for a comment line.
func quoteName(name string) string {
	if name == "" {
		return "(unnamed)"
	}
	return strconv.Quote(name)
}
