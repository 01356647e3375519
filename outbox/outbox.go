// Package outbox names what outbox-cdc puts on the wire for consumers: the headers of every record
// and of dead-letter records, and Kafka's rule for topic names. It imports nothing, so that a
// consumer-side package can use the names without pulling in a Kafka client.
package outbox

import (
	"strings"
)

// Header names set on every record (from the outbox row's columns).
const (
	HeaderEventID          = "event_id"
	HeaderEventType        = "event_type"
	HeaderAggregateType    = "aggregate_type"
	HeaderAggregateVersion = "aggregate_version"
	HeaderCreatedAt        = "created_at"
)

// DLQHeaderPrefix starts every dead-letter header name. A row's own headers under it are dropped, so
// that they can never pass for these.
const DLQHeaderPrefix = "outbox.dlq."

// Header names set on dead-letter records, besides the original record's headers.
const (
	// HeaderDLQReason says why the row can never be delivered.
	HeaderDLQReason = DLQHeaderPrefix + "reason"
	// HeaderDLQSourceLSN is the row's WAL position ("snapshot@<lsn>" for resync's snapshot rows).
	HeaderDLQSourceLSN = DLQHeaderPrefix + "source_lsn"
	// HeaderDLQTime is when the row was dead-lettered (RFC 3339).
	HeaderDLQTime = DLQHeaderPrefix + "time"
	// HeaderDLQTopic is the topic the row was routed to, when it had one.
	HeaderDLQTopic = DLQHeaderPrefix + "original_topic"
	// HeaderDLQTruncated and HeaderDLQOriginalBytes mark a value cut to fit the dead-letter topic.
	HeaderDLQTruncated     = DLQHeaderPrefix + "value_truncated"
	HeaderDLQOriginalBytes = DLQHeaderPrefix + "original_value_bytes"
	// HeaderDLQKeyTruncated and HeaderDLQOriginalKeyBytes mark a key cut to fit.
	HeaderDLQKeyTruncated     = DLQHeaderPrefix + "key_truncated"
	HeaderDLQOriginalKeyBytes = DLQHeaderPrefix + "original_key_bytes"
	// HeaderDLQHeadersDropped and HeaderDLQOriginalHeaderSize mark the row's headers dropped to fit:
	// how many, and their bytes.
	HeaderDLQHeadersDropped     = DLQHeaderPrefix + "headers_dropped"
	HeaderDLQOriginalHeaderSize = DLQHeaderPrefix + "original_headers_bytes"
)

// ValidTopic reports whether name is a legal Kafka topic name for records: 1 to 249 of
// [a-zA-Z0-9._-], not "." or "..", and not starting with "__" (Kafka's internal topics, such as
// __consumer_offsets and __transaction_state).
func ValidTopic(name string) bool {
	if len(name) == 0 || len(name) > 249 || name == "." || name == ".." || strings.HasPrefix(name, "__") {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
