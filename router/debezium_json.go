// Debezium's JSON as Kafka Connect's converters write it: Java's doubles, Jackson's string escapes, and
// the expansion of a JSON payload with the schema Debezium infers (table.expand.json.payload).

package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// javaDouble formats f as Java's Double.toString (Float.toString for 32 bits) does: plain decimal
// with at least one fractional digit between 10^-3 and 10^7, otherwise d.dddE[-]n; the shortest
// digits that read back as f.
func javaDouble(f float64, bits int) string {
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	sci := strconv.FormatFloat(f, 'e', -1, bits) // [-]d[.ddd]e±xx
	mant, expText, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expText)
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.Replace(mant, ".", "", 1)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	abs := math.Abs(f)
	if abs >= 1e-3 && abs < 1e7 {
		if exp >= 0 {
			intLen := exp + 1
			if len(digits) <= intLen {
				b.WriteString(digits + strings.Repeat("0", intLen-len(digits)) + ".0")
			} else {
				b.WriteString(digits[:intLen] + "." + digits[intLen:])
			}
		} else {
			b.WriteString("0." + strings.Repeat("0", -exp-1) + digits)
		}
		return b.String()
	}
	b.WriteString(digits[:1] + ".")
	if len(digits) > 1 {
		b.WriteString(digits[1:])
	} else {
		b.WriteByte('0')
	}
	b.WriteString("E" + strconv.Itoa(exp))
	return b.String()
}

// jacksonString appends s as a JSON string the way Jackson (Kafka Connect's JsonConverter) writes
// it: quotes and backslashes escaped, \b \t \n \f \r by their short escapes, other control
// characters as \u00XX, characters beyond the Basic Multilingual Plane as their UTF-16 surrogate
// pair (\uD83D\uDE00; hexadecimal in upper case), everything else (other non-ASCII included) as it is.
func jacksonString(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		case c < utf8.RuneSelf:
			b = append(b, c)
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				b = append(b, `\uFFFD`...)
			case r > 0xFFFF:
				hi, lo := utf16.EncodeRune(r)
				for _, u := range []rune{hi, lo} {
					b = append(b, '\\', 'u', hex[u>>12&0xF], hex[u>>8&0xF], hex[u>>4&0xF], hex[u&0xF])
				}
			default:
				b = append(b, s[i:i+size]...)
			}
			i += size - 1
		}
	}
	return append(b, '"')
}

// expandJSON is table.expand.json.payload followed by JsonConverter: a payload starting with { or [
// is parsed and written back compactly, as Debezium's JsonSchemaData and the converter do — members
// in their order, null members and empty arrays left out of objects, integers as integers, other
// numbers as Java doubles. false (the payload stays a JSON string) where Debezium's expansion fails:
// not JSON, a top-level array, an array mixing kinds of values or of numbers, an integer beyond
// 64 bits; and where expanding would change a string (an unpaired surrogate escape).
func expandJSON(payload string) ([]byte, bool) {
	if !strings.HasPrefix(payload, "{") && !strings.HasPrefix(payload, "[") {
		return nil, false
	}
	dec := json.NewDecoder(strings.NewReader(payload))
	dec.UseNumber()
	node, err := decodeOrdered(dec)
	if err != nil {
		return nil, false
	}
	if _, ok := node.([]any); ok {
		// Debezium 3.6 cannot expand a top-level array (its connector task stops on one); written
		// as the JSON string it is.
		return nil, false
	}
	var b bytes.Buffer
	if !writeExpanded(&b, node) {
		return nil, false
	}
	if bytes.Count(b.Bytes(), []byte(string(utf8.RuneError))) > replacements([]byte(payload)) {
		// Decoding turned an unpaired surrogate escape ("\ud800", which a json column takes) into
		// U+FFFD: expanded, the payload would change; as the JSON string it is, it does not.
		return nil, false
	}
	return b.Bytes(), true
}

// member is one member of a JSON object, in document order.
type member struct {
	name  string
	value any
}

// decodeOrdered reads one JSON value keeping object members in order: objects as []member, arrays
// as []any, numbers as json.Number.
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			var obj []member
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				obj = append(obj, member{name: k.(string), value: v})
			}
			_, err := dec.Token()
			return obj, err
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return tok, nil
	}
}

// numberKind is how Jackson and JsonSchemaData read a JSON number: int (32 bits), long (64 bits),
// double, or none (an integer beyond 64 bits, which Debezium cannot expand).
func numberKind(n json.Number) string {
	s := n.String()
	if !strings.ContainsAny(s, ".eE") {
		i, err := strconv.ParseInt(s, 10, 64)
		switch {
		case err != nil:
			return ""
		case i >= math.MinInt32 && i <= math.MaxInt32:
			return "int"
		default:
			return "long"
		}
	}
	return "double"
}

// kind is the JSON node type of v, numbers by numberKind.
func kind(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		return numberKind(t)
	case []any:
		return "array"
	case []member:
		return "object"
	}
	return ""
}

// writeExpanded writes v compactly as JsonConverter writes the Connect data Debezium built from it;
// false where Debezium's expansion fails.
func writeExpanded(b *bytes.Buffer, v any) bool {
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case string:
		b.Write(jacksonString(nil, t))
	case json.Number:
		switch numberKind(t) {
		case "int", "long":
			i, _ := strconv.ParseInt(t.String(), 10, 64)
			b.WriteString(strconv.FormatInt(i, 10))
		case "double":
			f, err := strconv.ParseFloat(t.String(), 64)
			if err != nil || math.IsInf(f, 0) {
				return false
			}
			b.WriteString(javaDouble(f, 64))
		default:
			return false
		}
	case []member:
		b.WriteByte('{')
		for i, m := range objectMembers(t) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(jacksonString(nil, m.name))
			b.WriteByte(':')
			if !writeExpanded(b, m.value) {
				return false
			}
		}
		b.WriteByte('}')
	case []any:
		// Elements share one kind (nulls aside); objects one shape: Debezium merges differing
		// objects' members in an order it does not fix, so those are not expanded here.
		k, shape := "", ""
		for _, e := range t {
			ek := kind(e)
			switch {
			case ek == "null":
				continue
			case ek == "":
				return false
			case k == "":
				k = ek
			case ek != k:
				return false
			}
			if ek == "object" {
				s := signature(e)
				if shape != "" && s != shape {
					return false
				}
				shape = s
			}
		}
		if k == "" {
			return false
		}
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			if !writeExpanded(b, e) {
				return false
			}
		}
		b.WriteByte(']')
	default:
		return false
	}
	return true
}

// objectMembers are the members of an object as JsonSchemaData keeps them: a repeated name in its
// first place with its last value (Jackson's reading), then null members and empty arrays left out
// (they get no schema).
func objectMembers(obj []member) []member {
	var out []member
	at := map[string]int{}
	for _, m := range obj {
		if i, ok := at[m.name]; ok {
			out[i].value = m.value
			continue
		}
		at[m.name] = len(out)
		out = append(out, m)
	}
	kept := out[:0]
	for _, m := range out {
		if arr, ok := m.value.([]any); m.value == nil || ok && len(arr) == 0 {
			continue
		}
		kept = append(kept, m)
	}
	return kept
}

// signature is the shape of a JSON value as JsonSchemaData would type it: kinds, member names
// and element kinds, recursively.
func signature(v any) string {
	switch t := v.(type) {
	case []member:
		var b strings.Builder
		b.WriteByte('{')
		for _, m := range objectMembers(t) {
			b.WriteString(strconv.Quote(m.name) + ":" + signature(m.value) + ",")
		}
		b.WriteByte('}')
		return b.String()
	case []any:
		for _, e := range t {
			if e != nil {
				return "[" + signature(e) + "]"
			}
		}
		return "[]"
	default:
		return kind(v)
	}
}
