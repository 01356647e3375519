// Package cloudevents holds the interoperability test of outbox-cdc's CloudEvents header format with
// the official CloudEvents Go SDK. It is a module of its own so that the SDK and the Kafka client its
// protocol binding needs (sarama) never become dependencies of outbox-cdc.
package cloudevents
