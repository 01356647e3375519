package fleet

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// View is the fleet as one instance sees it: GET /api/sources.
type View struct {
	// Instance is this instance's name; Group the consumer group it shares the sources in ("" without
	// coordination).
	Instance string `json:"instance"`
	Group    string `json:"group,omitempty"`
	// Sources are every source of the configuration, in its order.
	Sources []SourceView `json:"sources"`
	// Problems says what could not be learned (the owners, when the group cannot be described).
	Problems []string `json:"problems"`
	// At is when the view was taken.
	At time.Time `json:"at"`
}

// SourceView is one source in the fleet API. The figures (lag, seconds behind, counts, errors) are
// those of this instance: present for a source streamed here, absent for one streamed elsewhere (ask
// its owner).
type SourceView struct {
	Name string `json:"name"`
	// Owner is the instance the source is assigned to ("" when none is, or without coordination: this
	// one); Assigned says whether it is this instance (its JSON name, "here", is kept for the
	// scripts that read it).
	Owner    string `json:"owner"`
	Assigned bool   `json:"here"`
	// State is streaming, standby (another instance holds the slot), starting (connecting, retrying),
	// failed (held after a permanent error), paused, or elsewhere (streamed by Owner).
	State string `json:"state"`
	// Ready is the source's readiness here; Reason says why it is not, or what it does.
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// Paused, PausedBy and PausedAt are the fleet-wide pause state.
	Paused   bool       `json:"paused"`
	PausedBy string     `json:"paused_by,omitempty"`
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// Database (user@host:port/db, no password; every host of a multi-host URL), Table, Slot and
	// Delivery describe the source; Server is the host:port it streams from here now (with a
	// multi-host URL, the one that answered).
	Database string `json:"database"`
	Server   string `json:"server,omitempty"`
	Table    string `json:"table"`
	// Tables are the source's further outbox tables (its tables list), which share its slot.
	Tables []string `json:"tables,omitempty"`
	// MessagePrefixes are the prefixes of the WAL messages the source reads (postgres.message_prefixes).
	MessagePrefixes []string `json:"message_prefixes,omitempty"`
	Slot            string   `json:"slot"`
	Delivery        string   `json:"delivery"`
	// LagBytes is the slot's lag behind the server's WAL; SecondsBehind the age of the oldest
	// unacknowledged transaction; null when not known here.
	LagBytes      *int64   `json:"lag_bytes"`
	SecondsBehind *float64 `json:"seconds_behind"`
	// Produced and DeadLettered count this instance's records of the source since it started it.
	Produced     int64 `json:"produced"`
	DeadLettered int64 `json:"dead_lettered"`
	// Rows and Messages count the outbox rows and WAL messages this instance decoded of the source.
	Rows     int64 `json:"rows"`
	Messages int64 `json:"messages"`
	// LastError is the last failure of the source here, at LastErrorAt.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// Snapshot returns the fleet as this instance sees it now.
func (f *Fleet) Snapshot(ctx context.Context) View {
	v := View{Instance: f.instance(), Sources: []SourceView{}, Problems: []string{}, At: time.Now().UTC()}
	var owners map[string]string
	if f.coord != nil {
		v.Group = f.coord.Group
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		owners, err = f.coord.Owners(octx)
		cancel()
		if err != nil {
			v.Problems = append(v.Problems, "owners unknown: "+f.scrub(err.Error()))
		}
		if p := f.coord.Problem(); p != "" {
			v.Problems = append(v.Problems, f.scrub(p))
		}
	}
	for _, r := range f.sources {
		cfg := r.src.Config
		r.mu.Lock()
		assigned, pause := r.assigned, r.pause
		r.mu.Unlock()
		sv := SourceView{
			Name: cfg.Name, Owner: owners[cfg.Name], Assigned: assigned, Paused: pause.Paused,
			Database: f.scrub(cfg.PostgresTarget()), Table: cfg.Postgres.Table, Slot: cfg.Postgres.Slot, Delivery: cfg.Kafka.Delivery,
		}
		for _, t := range cfg.Tables {
			sv.Tables = append(sv.Tables, t.Name)
		}
		sv.MessagePrefixes = cfg.Postgres.MessagePrefixes
		if pause.Paused {
			sv.PausedBy = f.scrub(pause.By)
			at := pause.At
			sv.PausedAt = &at
		}
		if f.coord == nil {
			sv.Owner = v.Instance
		}
		if !assigned {
			sv.State = "elsewhere"
			if pause.Paused {
				sv.State = "paused"
			}
			if sv.Owner == "" {
				sv.Reason = "assigned to no instance right now (the group is rebalancing, or no instance is live)"
			} else {
				sv.Reason = "streamed by " + sv.Owner
			}
			v.Sources = append(v.Sources, sv)
			continue
		}
		h := r.health()
		sv.State, sv.Ready, sv.Reason = stateOf(h), h.Ready, h.NotReady
		if h.SlotKnown && h.Slot.Exists {
			lag := h.Slot.LagBytes
			sv.LagBytes = &lag
		}
		if h.State == pipeline.StateStreaming {
			behind := h.SecondsBehind
			sv.SecondsBehind = &behind
		}
		sv.Produced, sv.DeadLettered, sv.Server = h.Produced, h.DeadLettered, h.Server
		sv.Rows, sv.Messages = h.Rows, h.Messages
		if h.LastError != "" {
			sv.LastError = f.scrub(h.LastError)
			at := h.LastErrorAt.UTC()
			sv.LastErrorAt = &at
		}
		v.Sources = append(v.Sources, sv)
	}
	return v
}

// stateOf names a source's state from its health.
func stateOf(h pipeline.Health) string {
	switch {
	case h.Paused:
		return "paused"
	case strings.HasPrefix(h.NotReady, "failed:"):
		return "failed"
	case h.Ready:
		return "streaming"
	case h.State == pipeline.StateStandby:
		return "standby"
	}
	return "starting"
}

// instance is this instance's name in the fleet API.
func (f *Fleet) instance() string {
	if f.coord != nil {
		return f.coord.Instance
	}
	return f.name
}

// scrub hides secrets (the scrubber given to New).
func (f *Fleet) scrub(s string) string {
	if f.scrubber == nil {
		return s
	}
	return f.scrubber(s)
}

// SetPaused pauses or resumes a source for the whole fleet (by names who asked, for the record). It
// needs the coordination: the pause state lives in its topic, so that the instance the source moves to
// keeps it paused.
func (f *Fleet) SetPaused(ctx context.Context, name string, paused bool, by string) error {
	if f.source(name) == nil {
		return fmt.Errorf("%w: %q", errNoSource, name)
	}
	if f.coord == nil {
		return errNoCoordination
	}
	return f.coord.SetPause(ctx, name, Pause{Paused: paused, By: by, At: time.Now().UTC()})
}

var (
	errNoSource       = errors.New("no such source")
	errNoCoordination = fmt.Errorf("pausing needs fleet.coordination %s: the pause state is kept in its topic for every instance", config.FleetKafka)
)

//go:embed status.html
var statusHTML string

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"bytes": func(p *int64) string {
		if p == nil {
			return "–"
		}
		v := float64(*p)
		for _, unit := range []string{"B", "kB", "MB", "GB", "TB"} {
			if v < 1000 || unit == "TB" {
				if unit == "B" {
					return fmt.Sprintf("%.0f %s", v, unit)
				}
				return fmt.Sprintf("%.1f %s", v, unit)
			}
			v /= 1000
		}
		return ""
	},
	"seconds": func(p *float64) string {
		if p == nil {
			return "–"
		}
		return fmt.Sprintf("%.1f s", *p)
	},
	"when": func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
}).Parse(statusHTML))

// APIOptions protect the fleet API: who may pause and resume, and under which names it answers.
type APIOptions struct {
	// TokenFile holds the credentials pause and resume need (metrics.admin_token_file): one per line,
	// a token alone or name:token, the name being who the pause is recorded as. Read at every request,
	// so that a rotated Secret takes effect at once. Empty: writes are taken from this host only
	// (a loopback peer).
	TokenFile string
	// AllowedHosts are the host names, besides IP addresses and localhost, the API and the status page
	// answer under (metrics.allowed_hosts; "*.example.com" for a domain's names): a request for any
	// other Host is refused, so that a web page cannot reach the API through DNS rebinding.
	AllowedHosts []string
}

// Handler serves the fleet API and the status page:
//
//	GET  /api/sources               the fleet as this instance sees it (View)
//	GET  /api/sources/{name}        one source (SourceView)
//	POST /api/sources/{name}/pause  pause a source fleet-wide (its slot released; nothing is lost)
//	POST /api/sources/{name}/resume resume it
//	GET  /status                    the same for people, as an HTML page with pause and resume buttons
//
// Pause and resume need a credential (APIOptions.TokenFile: a bearer token, or the page's token field)
// or, without one, a request from this host; the pause is recorded under the credential's name, never
// a name the request gives. POSTs from another site's page are refused (cross-origin protection), the
// pages may not be framed, and a Host the API does not answer under is refused (DNS rebinding).
func (f *Fleet) Handler(o APIOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/sources", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, f.Snapshot(r.Context()))
	})
	mux.HandleFunc("GET /api/sources/{name}", func(w http.ResponseWriter, r *http.Request) {
		for _, s := range f.Snapshot(r.Context()).Sources {
			if s.Name == r.PathValue("name") {
				writeJSON(w, http.StatusOK, s)
				return
			}
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no source %q", r.PathValue("name"))})
	})
	for action, paused := range map[string]bool{"pause": true, "resume": false} {
		mux.HandleFunc("POST /api/sources/{name}/"+action, func(w http.ResponseWriter, r *http.Request) {
			name := r.PathValue("name")
			by, code, why := o.authorize(r)
			if code != 0 {
				if code == http.StatusUnauthorized {
					w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-cdc"`)
				}
				f.log.Warn("fleet API: refused a request to "+action+" a source", "source", name, "remote", r.RemoteAddr, "reason", why)
				writeJSON(w, code, map[string]string{"error": why})
				return
			}
			err := f.SetPaused(r.Context(), name, paused, by)
			if err == nil {
				f.log.Info("fleet API: "+action+" requested", "source", name, "by", by, "remote", r.RemoteAddr)
			}
			if err == nil && strings.Contains(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
				// The status page's button: back to the page.
				http.Redirect(w, r, "/status", http.StatusSeeOther)
				return
			}
			switch {
			case err == nil:
				writeJSON(w, http.StatusAccepted, map[string]any{"name": name, "paused": paused, "by": by})
			case errors.Is(err, errNoSource):
				writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			case errors.Is(err, errNoCoordination):
				writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
			default:
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": f.scrub(err.Error())})
			}
		})
	}
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		page := struct {
			View
			NeedToken bool
		}{f.Snapshot(r.Context()), o.TokenFile != ""}
		if err := statusPage.Execute(w, page); err != nil {
			f.log.Warn("status page", "error", err.Error())
		}
	})
	protected := http.NewCrossOriginProtection().Handler(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Never inside another site's frame (clickjacking the buttons), never cached, no sniffing.
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if !o.hostAllowed(r.Host) {
			writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": fmt.Sprintf("the fleet API does not answer under the host %q: reach it by IP address or localhost, or add the name to metrics.allowed_hosts", r.Host)})
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether the API answers under the request's Host: an IP address, localhost,
// or one of AllowedHosts. A name a DNS-rebinding page made point at the instance is none of them.
func (o APIOptions) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, a := range o.AllowedHosts {
		a = strings.ToLower(strings.TrimSuffix(a, "."))
		if host == a || (strings.HasPrefix(a, "*.") && strings.HasSuffix(host, a[1:])) {
			return true
		}
	}
	return false
}

// authorize says who asks for a pause or resume (by), or why they may not (an HTTP status and the
// reason). With a token file, the request must carry one of its tokens (Authorization: Bearer, or the
// status page's token field); without, it must come from this host.
func (o APIOptions) authorize(r *http.Request) (by string, code int, why string) {
	if o.TokenFile == "" {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsLoopback() {
			return "a request from this host (" + host + ")", 0, ""
		}
		return "", http.StatusForbidden, "pause and resume need a credential: set metrics.admin_token_file (the Helm chart's admin token) and send it as a bearer token, or ask from the instance's own host"
	}
	given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		given = r.PostFormValue("token")
	}
	given = strings.TrimSpace(given)
	if given == "" {
		return "", http.StatusUnauthorized, "pause and resume need the admin token (metrics.admin_token_file) as a bearer token"
	}
	data, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return "", http.StatusServiceUnavailable, "metrics.admin_token_file cannot be read: " + err.Error()
	}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, token, named := strings.Cut(line, ":")
		if !named {
			name, token = fmt.Sprintf("admin token %d", i+1), line
		}
		if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(given)) == 1 {
			return strings.TrimSpace(name), 0, ""
		}
	}
	return "", http.StatusUnauthorized, "the token is not one of metrics.admin_token_file's"
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
