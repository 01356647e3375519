package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestScrubberHidesPasswordsWhateverTheShape(t *testing.T) {
	s := NewScrubber("s3cr3t/#%zz", "topsecret")
	for _, in := range []string{
		"connect to postgres://u:s3cr3t/#%zz@h:5432/db failed",
		"parse \"postgres://u:p@ss:w0rd@h/db\": invalid",
		"host=h user=u password='two words' dbname=x",
		"host=h user=u password='unterminated and more",
		"host=h password=plain sslmode=bogus",
		"?sslmode=require&password=inquery&x=1",
		"sasl failed for topsecret",
		"postgresql://u:%zz%zz@[::1]:5432/db",
	} {
		out := s.String(in)
		for _, secret := range []string{"s3cr3t", "p@ss:w0rd", "two words", "unterminated", "plain", "inquery", "topsecret", "%zz%zz"} {
			if strings.Contains(out, secret) {
				t.Errorf("%q -> %q still holds %q", in, out, secret)
			}
		}
	}
}

func TestHandlerScrubsMessagesAndAttributes(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, nil), NewScrubber("hunter22")))
	log = log.With("url", "postgres://u:hunter22@h/db")
	log.WithGroup("g").Error("failed with hunter22",
		"error", errors.New("auth hunter22 rejected"),
		"list", []string{"a", "hunter22"},
		slog.Group("nested", "dsn", "password=hunter22"),
		"count", 3)
	out := buf.String()
	if strings.Contains(out, "hunter22") {
		t.Fatalf("secret in log output: %s", out)
	}
	if !strings.Contains(out, `"count":3`) {
		t.Fatalf("a value with nothing to hide lost its form: %s", out)
	}
}

func TestSecretInsideALongerWordIsNotReplaced(t *testing.T) {
	s := NewScrubber("outbox")
	got := s.String(`outbox-cdc stopped; user=outbox password outbox, "outbox"`)
	want := `outbox-cdc stopped; user=xxxxx password xxxxx, "xxxxx"`
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestACommonWordAsPasswordDoesNotGarble: a password that is a word of the program's own vocabulary
// ("postgres") is hidden where it can be the password, and left alone in key names, labels and URL
// schemes, which it would otherwise garble ("xxxxx.slot").
func TestACommonWordAsPasswordDoesNotGarble(t *testing.T) {
	s := NewScrubber("postgres")
	for in, want := range map[string]string{
		"postgres.slot: must be lower-case letters":           "postgres.slot: must be lower-case letters",
		"set cfg.postgres to it":                              "set cfg.postgres to it",
		"postgres: connection refused":                        "postgres: connection refused",
		"connect to postgres://app:postgres@db:5432/x failed": "connect to postgres://app:xxxxx@db:5432/x failed",
		"host=db user=app password=postgres":                  "host=db user=app password=xxxxx",
		`auth failed with "postgres"`:                         `auth failed with "xxxxx"`,
		"password postgres rejected":                          "password xxxxx rejected",
	} {
		if got := s.String(in); got != want {
			t.Errorf("%q -> %q, want %q", in, got, want)
		}
	}
}

func TestWriterScrubsEveryWrite(t *testing.T) {
	var b strings.Builder
	w := NewScrubber("hunter2-secret").Writer(&b)
	fmt.Fprintf(w, "standby postgres://u:other-pw@h/db: connect with hunter2-secret failed\n")
	if got := b.String(); strings.Contains(got, "hunter2-secret") || strings.Contains(got, "other-pw") {
		t.Fatalf("secret printed: %q", got)
	}
}
