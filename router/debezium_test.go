package router

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/config"
)

func TestJavaDouble(t *testing.T) {
	tenth := 0.1 // a variable: constant arithmetic would be exact
	for _, tc := range []struct {
		f    float64
		bits int
		want string
	}{
		{1, 64, "1.0"}, {100, 64, "100.0"}, {9.99, 64, "9.99"}, {-2.5, 64, "-2.5"}, {0, 64, "0.0"},
		{math.Copysign(0, -1), 64, "-0.0"}, {0.001, 64, "0.001"}, {0.0001, 64, "1.0E-4"},
		{1e7, 64, "1.0E7"}, {9999999, 64, "9999999.0"}, {12345678.9, 64, "1.23456789E7"},
		{1.5e-10, 64, "1.5E-10"}, {tenth + 2*tenth, 64, "0.30000000000000004"}, {1e21, 64, "1.0E21"},
		{float64(float32(0.1)), 32, "0.1"}, {float64(float32(3.4028235e38)), 32, "3.4028235E38"},
	} {
		if got := javaDouble(tc.f, tc.bits); got != tc.want {
			t.Errorf("javaDouble(%v, %d) = %q, want %q", tc.f, tc.bits, got, tc.want)
		}
	}
}

func TestJacksonString(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:                   `"plain"`,
		`a"b\c`:                   `"a\"b\\c"`,
		"tab\tnl\ncr\r":           `"tab\tnl\ncr\r"`,
		"\b\f\x00\x1f\x7f":        `"\b\f\u0000\u001F` + "\x7f" + `"`,
		"<&>/ é € ключ 注文 \u2028": `"<&>/ é € ключ 注文 ` + "\u2028" + `"`,
		"😀-3":                     `"\uD83D\uDE00-3"`,
	} {
		if got := string(jacksonString(nil, in)); got != want {
			t.Errorf("jacksonString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestExpandJSON(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" means: not expanded
	}{
		{`{"b": 1, "a": "x"}`, `{"b":1,"a":"x"}`},
		{`{"total": 9.99, "n": 1.0, "big": 12345678901, "neg": -3, "e": 1e7}`, `{"total":9.99,"n":1.0,"big":12345678901,"neg":-3,"e":1.0E7}`},
		{`{"gone": null, "empty": [], "kept": [1, null, 2], "t": true}`, `{"kept":[1,null,2],"t":true}`},
		{`{"nested": {"x": {"y": "z"}}, "s": "q\"uote"}`, `{"nested":{"x":{"y":"z"}},"s":"q\"uote"}`},
		{`{"a": 1, "a": 2, "b": 3}`, `{"a":2,"b":3}`},
		{`{}`, `{}`},
		{`{"l": [{"a": 1}, {"a": 2}], "s": ["x", null]}`, `{"l":[{"a":1},{"a":2}],"s":["x",null]}`},
		{`[1, 2, 3]`, ``}, // a top-level array stops Debezium's connector
		{`[]`, ``},
		{`{"m": [1, "x"]}`, ``},                       // not homogenous
		{`{"m": [1, 12345678901]}`, ``},               // int and long
		{`{"m": [1, 1.5]}`, ``},                       // int and double
		{`{"m": [{"a": 1}, {"b": 2}]}`, ``},           // objects of two shapes
		{`{"n": 123456789012345678901234567890}`, ``}, // beyond 64 bits
		{`not json`, ``},
		{`{"a": "x\ud800"}`, ``}, // an unpaired surrogate would become U+FFFD
		{`{"a": "\ud83d\ude00\ufffd"}`, "{\"a\":\"\\uD83D\\uDE00\uFFFD\"}"}, // a pair, and U+FFFD itself
		{`"a string"`, ``},
		{`{"a": `, ``},
	} {
		got, ok := expandJSON(tc.in)
		if tc.want == "" {
			if ok {
				t.Errorf("expandJSON(%s) = %s, want it left a string", tc.in, got)
			}
			continue
		}
		if !ok || string(got) != tc.want {
			t.Errorf("expandJSON(%s) = %s (%v), want %s", tc.in, got, ok, tc.want)
		}
	}
}

// debeziumRow is a row of Debezium's default outbox table plus typed extra columns.
func debeziumRow(over map[string]string) typedMapRow {
	r := typedMapRow{mapRow: mapRow{
		"id": "7d1c4d6a-0000-4000-8000-000000000001", "aggregatetype": "order", "aggregateid": "42",
		"type": "OrderPaid", "payload": `{"total": 9.99}`,
		"flag": "t", "n": "7", "f": "1.5", "ts": "2026-12-03T10:00:00.123456Z", "tstz": "2026-12-03T12:00:00.5+02:00", "d": "2026-12-03", "part": "2",
	}, types: map[string]uint32{"id": 2950, "payload": 3802, "flag": oidBool, "n": oidInt8, "f": oidFloat8, "ts": oidTimestamp, "tstz": oidTimestamptz, "d": oidDate, "part": oidInt4}}
	for k, v := range over {
		if v == "<NULL>" {
			delete(r.mapRow, k)
		} else {
			r.mapRow[k] = v
		}
	}
	return r
}

func TestBuildDebeziumRecord(t *testing.T) {
	cols := config.DebeziumColumns()
	fields := func(spec string) []config.AdditionalField {
		f, err := config.Debezium{AdditionalPlacement: spec}.AdditionalFields()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	null := []byte(nil)
	for _, tc := range []struct {
		name    string
		row     typedMapRow
		format  DebeziumFormat
		key     []byte
		value   []byte
		headers []kgo.RecordHeader
		part    int32 // -1: not placed
	}{
		{name: "string converter", row: debeziumRow(nil), key: []byte("42"), value: []byte(`{"total": 9.99}`),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "json converter", row: debeziumRow(nil), format: DebeziumFormat{JSON: true}, key: []byte(`"42"`), value: []byte(`"{\"total\": 9.99}"`),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "json converter, expanded", row: debeziumRow(nil), format: DebeziumFormat{JSON: true, ExpandJSONPayload: true}, key: []byte(`"42"`), value: []byte(`{"total":9.99}`),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "NULL payload, string converter", row: debeziumRow(map[string]string{"payload": "<NULL>"}), key: []byte("42"), value: null,
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "NULL payload, json converter", row: debeziumRow(map[string]string{"payload": "<NULL>"}), format: DebeziumFormat{JSON: true}, key: []byte(`"42"`), value: []byte("null"),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "NULL payload, json converter, tombstone", row: debeziumRow(map[string]string{"payload": "<NULL>"}), format: DebeziumFormat{JSON: true, TombstoneOnEmptyPayload: true}, key: []byte(`"42"`), value: null,
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "empty object stays", row: debeziumRow(map[string]string{"payload": "{}"}), format: DebeziumFormat{TombstoneOnEmptyPayload: true}, key: []byte("42"), value: []byte("{}"),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "NULL key", row: debeziumRow(map[string]string{"aggregateid": "<NULL>"}), key: null, value: []byte(`{"total": 9.99}`),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: -1},
		{name: "headers by type", row: debeziumRow(map[string]string{"aggregatetype": "<NULL>"}),
			format: DebeziumFormat{Fields: fields("type:header:eventType,flag:header,n:header,f:header,ts:header,tstz:header,d:header,aggregatetype:header")},
			key:    []byte("42"), value: []byte(`{"total": 9.99}`),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}, {Key: "eventType", Value: []byte("OrderPaid")},
				{Key: "flag", Value: []byte("true")}, {Key: "n", Value: []byte("7")}, {Key: "f", Value: []byte("1.5")},
				{Key: "ts", Value: []byte("1796292000123456")}, {Key: "tstz", Value: []byte("2026-12-03T10:00:00.500000Z")}, {Key: "d", Value: []byte("20790")},
				{Key: "aggregatetype"}}, part: -1},
		{name: "envelope and partition", row: debeziumRow(nil), format: DebeziumFormat{JSON: true, Fields: fields("type:envelope:eventType,n:envelope,flag:envelope,tstz:envelope,part:partition")},
			key: []byte(`"42"`), value: []byte(`{"payload":"{\"total\": 9.99}","eventType":"OrderPaid","n":7,"flag":true,"tstz":"2026-12-03T10:00:00.500000Z"}`),
			headers: []kgo.RecordHeader{{Key: "id", Value: []byte("7d1c4d6a-0000-4000-8000-000000000001")}}, part: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := buildRecord(tc.row, cols, Format{Debezium: &tc.format})
			if err != nil {
				t.Fatal(err)
			}
			if string(rec.Key) != string(tc.key) || (rec.Key == nil) != (tc.key == nil) {
				t.Errorf("key %q, want %q", rec.Key, tc.key)
			}
			if string(rec.Value) != string(tc.value) || (rec.Value == nil) != (tc.value == nil) {
				t.Errorf("value %q, want %q", rec.Value, tc.value)
			}
			if len(rec.Headers) != len(tc.headers) {
				t.Fatalf("headers %v, want %v", rec.Headers, tc.headers)
			}
			for i, h := range tc.headers {
				got := rec.Headers[i]
				if got.Key != h.Key || string(got.Value) != string(h.Value) || (got.Value == nil) != (h.Value == nil) {
					t.Errorf("header %d: %s=%q, want %s=%q", i, got.Key, got.Value, h.Key, h.Value)
				}
			}
			if tc.part >= 0 && (!placed(rec) || rec.Partition != tc.part) {
				t.Errorf("partition %d (placed %v), want %d", rec.Partition, placed(rec), tc.part)
			}
			if tc.part < 0 && placed(rec) {
				t.Errorf("placed on %d, want the partitioner's choice", rec.Partition)
			}
		})
	}
	if _, err := buildRecord(debeziumRow(map[string]string{"id": "<NULL>"}), cols, Format{Debezium: &DebeziumFormat{}}); err == nil {
		t.Error("a NULL id was accepted")
	}
	if _, err := buildRecord(debeziumRow(map[string]string{"part": "-1"}), cols, Format{Debezium: &DebeziumFormat{Fields: fields("part:partition")}}); err == nil {
		t.Error("a negative partition was accepted")
	}
}

// TestPlacingPartitionerKeepsKafkasHash: records without a placed partition go where Kafka's own
// partitioner sends their key (murmur2, as Java's default partitioner and Debezium's producer).
func TestPlacingPartitionerKeepsKafkasHash(t *testing.T) {
	tp := placingPartitioner{kgo.UniformBytesPartitioner(64<<10, true, true, nil)}.ForTopic("t")
	// Java: Utils.toPositive(Utils.murmur2(key.getBytes(UTF_8))) % 3, computed by an independent
	// implementation of Kafka's murmur2.
	for key, want := range map[string]int{"42": 1, "order-1": 1, "1": 0, "2": 2, "customer-17": 1, "é": 0} {
		r := &kgo.Record{Key: []byte(key)}
		if got := tp.(kgo.TopicBackupPartitioner).PartitionByBackup(r, 3, nil); got != want {
			t.Errorf("key %q: partition %d, want %d", key, got, want)
		}
	}
	r := &kgo.Record{Key: []byte("42")}
	place(r, 2)
	if got := tp.Partition(r, 3); got != 2 || !tp.RequiresConsistency(r) {
		t.Errorf("placed record: partition %d", got)
	}
}

// TestJSONConverterDeadLettersBytesThatAreNotUTF8: an SQL_ASCII database stores any bytes; the json
// converter can only write UTF-8 and would turn the others into U+FFFD for good. Such a row is
// undeliverable, naming the column, and its dead-letter record keeps the stored bytes; the string
// converter passes them through, and UTF-8 beyond ASCII is written as it is.
func TestJSONConverterDeadLettersBytesThatAreNotUTF8(t *testing.T) {
	cols := config.DebeziumColumns()
	envelope, err := config.Debezium{AdditionalPlacement: "type:envelope:eventType"}.AdditionalFields()
	if err != nil {
		t.Fatal(err)
	}
	latin1 := "caf\xe9"
	for _, tc := range []struct {
		name    string
		over    map[string]string
		format  DebeziumFormat
		problem string // the column named, "" for none
		key     string
		value   string
	}{
		{"payload, json", map[string]string{"payload": `{"name": "` + latin1 + `"}`}, DebeziumFormat{JSON: true}, "payload", "42", `{"name": "` + latin1 + `"}`},
		{"payload, json, expanded", map[string]string{"payload": `{"name": "` + latin1 + `"}`}, DebeziumFormat{JSON: true, ExpandJSONPayload: true}, "payload", "42", `{"name": "` + latin1 + `"}`},
		{"key, json", map[string]string{"aggregateid": latin1}, DebeziumFormat{JSON: true}, "aggregateid", latin1, `{"total": 9.99}`},
		{"envelope field, json", map[string]string{"type": latin1}, DebeziumFormat{JSON: true, Fields: envelope}, "type", "42", `{"total": 9.99}`},
		{"payload, string", map[string]string{"payload": `{"name": "` + latin1 + `"}`}, DebeziumFormat{}, "", "42", `{"name": "` + latin1 + `"}`},
		{"UTF-8, json", map[string]string{"payload": `{"name": "café"}`}, DebeziumFormat{JSON: true}, "", `"42"`, `"{\"name\": \"café\"}"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := buildRecord(debeziumRow(tc.over), cols, Format{Debezium: &tc.format})
			var u *undeliverable
			switch {
			case tc.problem == "" && err != nil:
				t.Fatalf("unexpected problem %v", err)
			case tc.problem != "" && (!errors.As(err, &u) || !strings.Contains(err.Error(), "column "+tc.problem+" holds bytes that are not UTF-8")):
				t.Fatalf("problem %v, want the row undeliverable naming column %s", err, tc.problem)
			}
			if string(rec.Key) != tc.key || string(rec.Value) != tc.value {
				t.Fatalf("key %q value %q, want %q %q", rec.Key, rec.Value, tc.key, tc.value)
			}
		})
	}
}

// messageMapRow is a row made from a logical decoding message: its columns typed by their JSON kind
// as replication's messageRow types them.
type messageMapRow struct{ typedMapRow }

func (messageMapRow) Message() bool { return true }

// TestDebeziumMessageRecords: rows made from outbox messages are written as Debezium 3.6.1's
// PostgreSQL connector with DecodeLogicalDecodingMessageContent and the EventRouter writes the same
// message (the wants were read from the real Debezium; TestDebeziumMessagesMatch runs it side by
// side): the payload is the Connect value JsonSchemaData infers from the content, a struct's Java
// toString for StringConverter and expanded JSON for JsonConverter, whatever expand.json.payload says.
func TestDebeziumMessageRecords(t *testing.T) {
	const text, numeric, jsonb = 25, oidNumeric, oidJSONB
	for _, tc := range []struct {
		payload              string
		oid                  uint32
		wantString, wantJSON string
	}{
		{`{"total": 9.99, "items": [1, 2, 3], "note": "naïve \"q\"\nline", "z": null, "big": 12345678901, "f": 100.0}`, jsonb,
			"Struct{total=9.99,items=[1, 2, 3],note=naïve \"q\"\nline,big=12345678901,f=100.0}",
			`{"total":9.99,"items":[1,2,3],"note":"naïve \"q\"\nline","big":12345678901,"f":100.0}`},
		{"just a string", text, "just a string", `"just a string"`},
		{`{"as":"text"}`, text, `{"as":"text"}`, `"{\"as\":\"text\"}"`},
		{`123`, jsonb, "123", "123"},
		{`2.50`, jsonb, "2.5", "2.5"},
		{`true`, jsonb, "true", "true"},
		{`{"nested":{"a":[{"x":1},{"x":2}],"e":"😀"}}`, jsonb, "Struct{nested=Struct{a=[Struct{x=1}, Struct{x=2}],e=😀}}", `{"nested":{"a":[{"x":1},{"x":2}],"e":"\uD83D\uDE00"}}`},
		{`{"a":[],"b":{"c":[true,false],"d":-2.5e-7,"e":0.00001,"g":12345678.5}}`, jsonb, "Struct{b=Struct{c=[true, false],d=-2.5E-7,e=1.0E-5,g=1.23456785E7}}", `{"b":{"c":[true,false],"d":-2.5E-7,"e":1.0E-5,"g":1.23456785E7}}`},
		{`[1,2]`, jsonb, "[1, 2]", "[1,2]"},
		{`{}`, jsonb, "Struct{}", "{}"},
		{"", text, "", `""`},
		{`[{"x":1},{"x":2}]`, jsonb, "[Struct{x=1}, Struct{x=2}]", `[{"x":1},{"x":2}]`},
		{`["a",null,"b"]`, jsonb, "[a, null, b]", `["a",null,"b"]`},
		{`{"u":"\u0001\t"}`, jsonb, "Struct{u=\x01\t}", `{"u":"\u0001\t"}`},
		// Debezium's task stops on these; outbox-cdc writes the JSON as it is.
		{`[1, "mixed"]`, jsonb, `[1,"mixed"]`, `[1,"mixed"]`},
	} {
		for _, jsonConverter := range []bool{false, true} {
			row := messageMapRow{typedMapRow{mapRow: mapRow{
				"id": "7e0c2b43-0000-4000-8000-000000000001", "aggregatetype": "order", "aggregateid": "42", "type": "Placed", "payload": tc.payload,
				"n": "5", "flag": "true",
			}, types: map[string]uint32{"id": text, "aggregatetype": text, "aggregateid": text, "type": text, "payload": tc.oid, "n": numeric, "flag": 16}}}
			rec, err := buildDebeziumRecord(row, config.DebeziumColumns(), &DebeziumFormat{JSON: jsonConverter,
				Fields: []config.AdditionalField{{Column: "type", Placement: config.PlacementHeader, Alias: "eventType"}, {Column: "n", Placement: config.PlacementHeader, Alias: "n"}}})
			if err != nil {
				t.Fatalf("%s: %v", tc.payload, err)
			}
			want, wantKey := tc.wantString, "42"
			if jsonConverter {
				want, wantKey = tc.wantJSON, `"42"`
			}
			if string(rec.Value) != want || string(rec.Key) != wantKey {
				t.Errorf("payload %s (json converter %t): key %s value %q, want key %s value %q", tc.payload, jsonConverter, rec.Key, rec.Value, wantKey, want)
			}
			if h := rec.Headers[2]; h.Key != "n" || string(h.Value) != "5" {
				t.Errorf("payload %s: header %s=%q, want n=5", tc.payload, h.Key, h.Value)
			}
		}
	}
}
