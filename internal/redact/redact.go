// Package redact keeps secrets out of logs and error output: a slog.Handler that scrubs every record
// (message and attributes, whatever their shape) of known secrets and of anything that looks like a
// password in a URL or a key=value connection string.
package redact

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces what is hidden.
const Mask = "xxxxx"

var (
	// urlUserinfo matches scheme://user:password@ and keeps scheme://user:.
	urlUserinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^\s]*@`)
	// passwordPair matches password=value in a query string or a key=value connection string, the
	// value quoted (to its closing quote, or to the end when unterminated) or not.
	passwordPair = regexp.MustCompile(`(?i)(pass(?:word)?\s*=\s*)('(?:[^'\\]|\\.)*(?:'|$)|[^\s&]*)`)
)

// Scrubber hides a set of secrets in strings.
type Scrubber struct {
	secrets []string // longest first
}

// minSecret is the shortest secret replaced wherever it occurs: shorter ones would garble every log
// line, and the URL and key=value patterns still hide them where they appear as passwords.
const minSecret = 4

// NewScrubber returns a scrubber for secrets (empty and very short ones are left to the patterns).
func NewScrubber(secrets ...string) *Scrubber {
	s := &Scrubber{}
	for _, v := range secrets {
		if len(v) >= minSecret && !slices.Contains(s.secrets, v) {
			s.secrets = append(s.secrets, v)
		}
	}
	slices.SortFunc(s.secrets, func(a, b string) int { return len(b) - len(a) })
	return s
}

// String returns v with every secret, URL password and password=value hidden. A secret is hidden
// wherever it can be the secret: standing on its own. Where it is part of something longer it is a
// word of the program's own, and left as it is, so that a password that is a common word ("postgres")
// does not garble the messages: inside a longer word ("outbox" in "outbox-cdc"), in a dotted name
// ("postgres.slot", "cfg.postgres"), or as a label or URL scheme ("postgres:", "postgres://"). The
// URL and key=value patterns hide it where it stands as a password in those.
func (s *Scrubber) String(v string) string {
	if s != nil {
		for _, secret := range s.secrets {
			v = replaceStandalone(v, secret)
		}
	}
	v = urlUserinfo.ReplaceAllString(v, "${1}"+Mask+"@")
	return passwordPair.ReplaceAllString(v, "${1}"+Mask)
}

// replaceStandalone replaces the occurrences of secret in v that are not part of a longer word.
func replaceStandalone(v, secret string) string {
	var b strings.Builder
	for {
		i := strings.Index(v, secret)
		if i < 0 {
			if b.Len() == 0 {
				return v
			}
			b.WriteString(v)
			return b.String()
		}
		end := i + len(secret)
		first, last := wordByte(secret[0]), wordByte(secret[len(secret)-1])
		glued := (i > 0 && wordByte(v[i-1]) && first) ||
			(end < len(v) && wordByte(v[end]) && last) ||
			// a dotted name: postgres.slot, cfg.postgres
			(end+1 < len(v) && v[end] == '.' && wordByte(v[end+1]) && last) ||
			(i > 1 && v[i-1] == '.' && wordByte(v[i-2]) && first) ||
			// a label or a scheme: "postgres: ...", postgres://
			(end < len(v) && v[end] == ':' && last)
		b.WriteString(v[:i])
		if glued {
			b.WriteString(secret)
		} else {
			b.WriteString(Mask)
		}
		v = v[end:]
	}
}

// wordByte reports whether c continues a word: letters, digits, '_' and '-'.
func wordByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// Handler wraps a slog.Handler and scrubs every record it passes on.
type Handler struct {
	inner slog.Handler
	s     *Scrubber
}

// NewHandler returns a handler that scrubs records with s before inner sees them.
func NewHandler(inner slog.Handler, s *Scrubber) *Handler { return &Handler{inner: inner, s: s} }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.s.String(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	scrubbed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		scrubbed[i] = h.attr(a)
	}
	return &Handler{inner: h.inner.WithAttrs(scrubbed), s: h.s}
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{inner: h.inner.WithGroup(name), s: h.s}
}

func (h *Handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.s.String(v.String()))
	case slog.KindGroup:
		group := v.Group()
		scrubbed := make([]any, len(group))
		for i, g := range group {
			scrubbed[i] = h.attr(g)
		}
		return slog.Group(a.Key, scrubbed...)
	case slog.KindAny:
		// Errors, stringers, slices, structs: whatever they print is scrubbed; a value with nothing
		// to hide keeps its own form.
		text := fmt.Sprint(v.Any())
		if clean := h.s.String(text); clean != text {
			return slog.String(a.Key, clean)
		}
		return slog.Attr{Key: a.Key, Value: v}
	default:
		return slog.Attr{Key: a.Key, Value: v}
	}
}

// Writer returns a writer that scrubs every write to w with String: for command output written a
// line at a time.
func (s *Scrubber) Writer(w io.Writer) io.Writer { return scrubWriter{s: s, w: w} }

type scrubWriter struct {
	s *Scrubber
	w io.Writer
}

// Write implements io.Writer; it reports len(p) written when the scrubbed text was written whole.
func (sw scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(sw.w, sw.s.String(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
