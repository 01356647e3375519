package fleet

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/config"
)

// apiFleet is a fleet of one source without coordination: its pause requests get past the checks
// and end in 409 (pausing needs the coordination), which tells a request that was let through.
func apiFleet(t *testing.T) *Fleet {
	t.Helper()
	cfg := config.Default()
	cfg.Name = "orders"
	cfg.Postgres.URL = "postgres://u@127.0.0.1:5432/db"
	cfg.Kafka.Brokers = []string{"127.0.0.1:9092"}
	f, err := New(slog.New(slog.DiscardHandler), nil, nil, nil, []Source{{Config: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAPIWritesNeedACredential: without a token file, pause and resume are taken from this host only;
// with one, only with one of its tokens (as a bearer token or the status page's field), and the
// recorded identity is the token's name, never the request's "by". The token file is read at every
// request, so a rotated token takes effect at once.
func TestAPIWritesNeedACredential(t *testing.T) {
	f := apiFleet(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("# operators\nalice:s3cret-alice\n  plain-token  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	post := func(h http.Handler, remote, auth, form string) (int, string) {
		var body io.Reader
		if form != "" {
			body = strings.NewReader(form)
		}
		r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:9187/api/sources/orders/pause", body)
		r.RemoteAddr = remote
		if form != "" {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	open := f.Handler(APIOptions{})
	locked := f.Handler(APIOptions{TokenFile: tokens})
	for _, tc := range []struct {
		name         string
		h            http.Handler
		remote, auth string
		form         string
		want         int
	}{
		{"no token file, another host", open, "10.1.2.3:40000", "", "", http.StatusForbidden},
		{"no token file, another host naming itself", open, "10.1.2.3:40000", "", "by=admin", http.StatusForbidden},
		{"no token file, this host", open, "127.0.0.1:40000", "", "", http.StatusConflict},
		{"no token file, this host over IPv6", open, "[::1]:40000", "", "", http.StatusConflict},
		{"token file, no token", locked, "127.0.0.1:40000", "", "", http.StatusUnauthorized},
		{"token file, wrong token", locked, "10.1.2.3:40000", "Bearer s3cret-bob", "", http.StatusUnauthorized},
		{"token file, a name as the token", locked, "10.1.2.3:40000", "Bearer alice", "", http.StatusUnauthorized},
		{"token file, basic auth", locked, "10.1.2.3:40000", "Basic YWxpY2U6czNjcmV0LWFsaWNl", "", http.StatusUnauthorized},
		{"named token", locked, "10.1.2.3:40000", "Bearer s3cret-alice", "", http.StatusConflict},
		{"plain token", locked, "10.1.2.3:40000", "Bearer plain-token", "", http.StatusConflict},
		{"the page's token field", locked, "10.1.2.3:40000", "", "token=s3cret-alice", http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := post(tc.h, tc.remote, tc.auth, tc.form); code != tc.want {
				t.Errorf("got %d %s, want %d", code, body, tc.want)
			}
		})
	}
	// Who it is recorded as: the token's name (authorize, which SetPaused receives).
	r := httptest.NewRequest(http.MethodPost, "/api/sources/orders/pause?by=mallory", strings.NewReader("by=mallory"))
	r.Header.Set("Authorization", "Bearer s3cret-alice")
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if by, code, _ := (APIOptions{TokenFile: tokens}).authorize(r); code != 0 || by != "alice" {
		t.Errorf("recorded as %q (%d), want alice", by, code)
	}
	// A rotated token: the old one no longer works, the new one does, without a restart.
	if err := os.WriteFile(tokens, []byte("alice:rotated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _ := post(locked, "10.1.2.3:40000", "Bearer s3cret-alice", ""); code != http.StatusUnauthorized {
		t.Errorf("the old token after rotation: %d, want 401", code)
	}
	if code, _ := post(locked, "10.1.2.3:40000", "Bearer rotated", ""); code != http.StatusConflict {
		t.Errorf("the new token after rotation: %d, want it let through", code)
	}
}

// TestAPIRefusesOtherHostsAndFrames: the API and the status page answer under IP addresses,
// localhost and the allowed names only (a DNS-rebinding page's name is refused), the page may not be
// framed, and the read views stay open to whoever reaches the address.
func TestAPIRefusesOtherHostsAndFrames(t *testing.T) {
	f := apiFleet(t)
	h := f.Handler(APIOptions{AllowedHosts: []string{"outbox-cdc.ops.svc", "*.internal.example"}})
	get := func(target, host string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	for host, want := range map[string]int{
		"127.0.0.1:9187": 200, "[::1]:9187": 200, "10.0.3.7:9187": 200, "localhost:9187": 200, "LOCALHOST": 200,
		"outbox-cdc.ops.svc:9187": 200, "a.internal.example": 200, "outbox-cdc.ops.svc.": 200,
		"attacker.example:9187": http.StatusMisdirectedRequest, "internal.example": http.StatusMisdirectedRequest,
		"outbox-cdc.ops.svc.evil.example": http.StatusMisdirectedRequest,
	} {
		if rec := get("/api/sources", host); rec.Code != want {
			t.Errorf("Host %q: %d, want %d", host, rec.Code, want)
		}
	}
	rec := get("/status", "127.0.0.1:9187")
	if rec.Code != 200 || rec.Header().Get("X-Frame-Options") != "DENY" || !strings.Contains(rec.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("/status: %d, headers %v", rec.Code, rec.Header())
	}
	var v View
	if err := json.Unmarshal(get("/api/sources", "10.0.3.7").Body.Bytes(), &v); err != nil || len(v.Sources) != 1 || v.Sources[0].Name != "orders" {
		t.Errorf("the read view: %+v %v", v, err)
	}
	// The page asks for the token when writes need one, and does not refresh under the typing.
	withToken := f.Handler(APIOptions{TokenFile: "/nonexistent"})
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9187/status", nil)
	page := httptest.NewRecorder()
	withToken.ServeHTTP(page, r)
	if body := page.Body.String(); !strings.Contains(body, `name="token"`) || strings.Contains(body, `http-equiv="refresh"`) {
		t.Errorf("the status page with a token file lacks the token field or refreshes itself")
	}
	// A cross-site form post is refused before anything else.
	form := url.Values{"token": {"x"}}.Encode()
	cross := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:9187/api/sources/orders/pause", strings.NewReader(form))
	cross.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	cross.Header.Set("Sec-Fetch-Site", "cross-site")
	cross.RemoteAddr = "127.0.0.1:5000"
	crossRec := httptest.NewRecorder()
	h.ServeHTTP(crossRec, cross)
	if crossRec.Code != http.StatusForbidden {
		t.Errorf("a cross-site post: %d, want 403", crossRec.Code)
	}
}
