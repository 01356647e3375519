// What the pipeline reads of its configuration for the stream and the router: the columns of each
// role, the outbox tables, their routing rules and the record format.

package pipeline

import (
	"slices"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// columnRoles are the columns the router reads, checked at set-up against the table and on every
// Relation message of the stream: the four without which no record can be built, and the topic
// template's columns, are required; the header columns are optional.
func columnRoles(cfg config.Config, rules ...*router.Rules) []replication.ColumnRole {
	c := cfg.Postgres.Columns
	roles := []replication.ColumnRole{
		{Column: c.EventID, Key: "postgres.columns.event_id", Required: true},
		{Column: c.EventType, Key: "postgres.columns.event_type", Required: true},
		{Column: c.AggregateID, Key: "postgres.columns.aggregate_id", Required: true},
		{Column: c.Payload, Key: "postgres.columns.payload", Required: true},
	}
	for _, o := range []replication.ColumnRole{
		{Column: c.AggregateType, Key: "postgres.columns.aggregate_type"},
		{Column: c.AggregateVersion, Key: "postgres.columns.aggregate_version"},
		{Column: c.Headers, Key: "postgres.columns.headers"},
		{Column: c.CreatedAt, Key: "postgres.columns.created_at"},
		{Column: c.TraceContext, Key: "postgres.columns.trace_context"},
	} {
		if o.Column != "" {
			roles = append(roles, o)
		}
	}
	if cfg.Kafka.HeaderFormat == config.HeaderFormatDebezium {
		// Debezium needs no event type (its default table has one; the router uses it for the
		// metrics' labels only).
		roles[1].Required = false
		// Debezium stops on an additional field the table lacks; so does the router, at start.
		fields, _ := cfg.Kafka.Debezium.AdditionalFields()
		for _, f := range fields {
			if i := slices.IndexFunc(roles, func(r replication.ColumnRole) bool { return r.Column == f.Column }); i >= 0 {
				roles[i].Required = true
			} else {
				roles = append(roles, replication.ColumnRole{Column: f.Column, Key: "kafka.debezium.additional_placement", Required: true})
			}
		}
	}
	if c.Timestamp != "" {
		// Asked for by name: a table without it is refused at start, not silently stamped otherwise.
		i := slices.IndexFunc(roles, func(r replication.ColumnRole) bool { return r.Column == c.Timestamp })
		if i < 0 {
			roles = append(roles, replication.ColumnRole{Column: c.Timestamp, Key: "postgres.columns.timestamp", Required: true})
		} else {
			roles[i].Required = true
		}
	}
	for _, r := range rules {
		for _, col := range r.TemplateColumns() {
			i := slices.IndexFunc(roles, func(r replication.ColumnRole) bool { return r.Column == col })
			if i < 0 {
				roles = append(roles, replication.ColumnRole{Column: col, Key: "routing.topic", Required: true})
			} else {
				roles[i].Required = true
			}
		}
	}
	return roles
}

// columnRoles are the columns the router reads from the rows of every outbox table.
func (p *Pipeline) columnRoles() []replication.ColumnRole {
	return columnRoles(p.cfg, append([]*router.Rules{p.rules}, p.tableRules...)...)
}

// outbox names the configured outbox table and publication.
func (p *Pipeline) outbox() replication.Outbox {
	schema, table := replication.SplitTable(p.cfg.Postgres.Table)
	return replication.Outbox{Schema: schema, Table: table, Publication: p.cfg.Postgres.Publication}
}

// tables names the further outbox tables (the tables list), which share the publication.
func (p *Pipeline) tables() []replication.Outbox {
	var out []replication.Outbox
	for _, t := range p.cfg.Tables {
		schema, table := replication.SplitTable(t.Name)
		out = append(out, replication.Outbox{Schema: schema, Table: table, Publication: p.cfg.Postgres.Publication})
	}
	return out
}

// allTables names every outbox table: the configured one, then the tables list.
func (p *Pipeline) allTables() []replication.Outbox {
	return append([]replication.Outbox{p.outbox()}, p.tables()...)
}

// rulesOf returns the routing rules of outbox table i (Row.Table).
func (p *Pipeline) rulesOf(i int) *router.Rules {
	if i > 0 && i <= len(p.tableRules) {
		return p.tableRules[i-1]
	}
	return p.rules
}

// format is kafka.header_format for the router.
func (p *Pipeline) format() router.Format {
	f := router.Format{CloudEvents: p.cfg.Kafka.HeaderFormat == config.HeaderFormatCloudEvents, Source: p.cfg.EventSource()}
	if p.cfg.Kafka.HeaderFormat == config.HeaderFormatDebezium {
		d := p.cfg.Kafka.Debezium
		fields, _ := d.AdditionalFields() // validated with the configuration
		f.Debezium = &router.DebeziumFormat{JSON: d.Converter == config.DebeziumConverterJSON, Fields: fields,
			ExpandJSONPayload: d.ExpandJSONPayload, TombstoneOnEmptyPayload: d.TombstoneOnEmptyPayload}
	}
	return f
}
