// What the configuration holds that must never be printed (Secrets), and the connection target shown
// instead of a URL.

package config

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Secrets returns every value of the configuration that must never be printed: the candidates for
// the password in the PostgreSQL URL, however malformed the URL is (each way of splitting its user
// information, escaped and unescaped, and any password=... value), and the SASL password. Loggers
// and error output hide each wherever it appears.
func (c *Config) Secrets() []string {
	// A password command is shown as little as a password: it may carry one (echo ..., a key).
	out := []string{c.Kafka.SASL.Password, c.envPassword, c.filePassword, c.Postgres.PasswordCommand}
	add := func(v string) {
		out = append(out, v)
		if u, err := url.PathUnescape(v); err == nil && u != v {
			out = append(out, u)
		}
		if u, err := url.QueryUnescape(v); err == nil && u != v {
			out = append(out, u)
		}
	}
	for _, u := range append([]string{c.Postgres.URL}, c.Postgres.StandbyURLs...) {
		urlSecrets(u, add)
	}
	for _, s := range c.SourceList {
		s.secrets(add)
	}
	for _, r := range c.resolved {
		out = append(out, r.Secrets()...)
	}
	return out
}

// urlSecrets feeds add the password candidates of one PostgreSQL URL or connection string.
func urlSecrets(u string, add func(string)) {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		if colon := strings.IndexByte(rest, ':'); colon >= 0 {
			for at := strings.IndexByte(rest, '@'); at >= 0; {
				if at > colon {
					// A password with an unescaped '@' is split by URL parsers: its pieces may show
					// up as a host name in connection errors.
					add(rest[colon+1 : at])
					for _, piece := range strings.Split(rest[colon+1:at], "@") {
						add(piece)
					}
				}
				next := strings.IndexByte(rest[at+1:], '@')
				if next < 0 {
					break
				}
				at += next + 1
			}
		}
	}
	for _, m := range passwordPairRE.FindAllStringSubmatch(u, -1) {
		v := m[1]
		add(v)
		if unquoted := strings.Trim(v, "'"); unquoted != v {
			add(unquoted)
			add(strings.ReplaceAll(strings.ReplaceAll(unquoted, `\'`, `'`), `\\`, `\`))
		}
	}
}

// passwordPairRE matches password=value in a URL's query or a key=value connection string.
var passwordPairRE = regexp.MustCompile(`(?i)pass(?:word)?\s*=\s*('(?:[^'\\]|\\.)*(?:'|$)|[^\s&]*)`)

// PostgresTarget describes the database for logs: user@host:port/database, never the password.
func (c *Config) PostgresTarget() string { return Target(c.Postgres.URL, "postgres.url") }

// Target describes the database of a PostgreSQL URL for logs: user@host:port/database, never the
// password; with several hosts (a multi-host URL), every one, since which answers is decided at each
// connection. key names the URL's configuration key when it cannot be parsed.
func Target(url, key string) string {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "(unparsable " + key + ")"
	}
	hosts := []string{fmt.Sprintf("%s:%d", pc.Host, pc.Port)}
	for _, fb := range pc.Fallbacks {
		if h := fmt.Sprintf("%s:%d", fb.Host, fb.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return fmt.Sprintf("%s@%s/%s", pc.User, strings.Join(hosts, ","), pc.Database)
}
