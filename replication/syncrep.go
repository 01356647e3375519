package replication

import (
	"context"
	"fmt"
	"regexp"
	"strings"
)

// numberedList is the head of the "N (...)", "FIRST N (...)" and "ANY N (...)" forms.
var numberedList = regexp.MustCompile(`(?i)^((first|any)\s+)?[0-9]+\s*\(`)

// synchronousStandby reports whether synchronous_standby_names (the primary's setting) names a
// walsender whose application_name is name: '*' names every one. PostgreSQL compares names without
// regard to case. The forms are "a, b", "N (a, b)", "FIRST N (a, b)" and "ANY N (a, b)"; names may be
// double-quoted ("" is a quote inside).
func synchronousStandby(setting, name string) bool {
	list := strings.TrimSpace(setting)
	if m := numberedList.FindStringIndex(list); m != nil {
		list = list[m[1]:]
		if j := strings.LastIndexByte(list, ')'); j >= 0 {
			list = list[:j]
		}
	}
	for _, item := range splitNames(list) {
		if item == "*" || (item != "" && strings.EqualFold(item, name)) {
			return true
		}
	}
	return false
}

// splitNames splits a comma-separated list of names, unquoting double-quoted ones.
func splitNames(list string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for i := 0; i < len(list); i++ {
		ch := list[i]
		switch {
		case quoted && ch == '"' && i+1 < len(list) && list[i+1] == '"':
			cur.WriteByte('"')
			i++
		case ch == '"':
			quoted = !quoted
		case !quoted && ch == ',':
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		case !quoted && (ch == ' ' || ch == '\t' || ch == '\n'):
			// outside quotes, blanks only separate
		default:
			cur.WriteByte(ch)
		}
	}
	return append(out, strings.TrimSpace(cur.String()))
}

// synchronousWarning returns a warning when the server's synchronous_standby_names names the
// walsender of application name (the replication connection's application_name): PostgreSQL then
// makes application commits wait for outbox-cdc's confirmations, which follow Kafka's
// acknowledgements, and they hang while outbox-cdc is stopped or Kafka is away. Empty otherwise.
func (c *Catalog) synchronousWarning(ctx context.Context, name string) (string, error) {
	if name == "" {
		return "", nil
	}
	var setting string
	if err := c.conn.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&setting); err != nil {
		return "", fmt.Errorf("read synchronous_standby_names: %w", err)
	}
	if !synchronousStandby(setting, name) {
		return "", nil
	}
	return fmt.Sprintf("synchronous_standby_names (%q) names this router's replication connection (application_name %q): PostgreSQL may make every commit wait for outbox-cdc's confirmation, "+
		"which follows Kafka's acknowledgement, and commits hang while outbox-cdc is stopped or Kafka is away. Name the physical standbys there instead of '*' or this name, "+
		"or give the router another application_name in postgres.url", setting, name), nil
}
