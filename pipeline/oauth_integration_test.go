package pipeline

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestOAuthBearerWithExpiringTokens: the router authenticates to the broker's OAUTHBEARER listener,
// which validates JWTs against the test provider's JWKS and makes connections re-authenticate every
// 5 s, with tokens of an OIDC client-credentials endpoint that live 8 s: under a steady writer for
// over three token lifetimes, tokens are fetched again before they expire, every event arrives in
// order, and the stream never stalls for longer than a token's life. At-least-once only: the
// authentication is the client's, the same in either mode (both passed, 2026-12-07).
func TestOAuthBearerWithExpiringTokens(t *testing.T) {
	f := testenv.NewFixture(t)
	const lifetime = 8 * time.Second
	var issued atomic.Int32
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, secret, ok := r.BasicAuth()
		if !ok || id != "outbox-cdc" || secret != "idp-secret" || r.FormValue("grant_type") != "client_credentials" {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_client"})
			return
		}
		issued.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": testenv.OAuthToken(t, testenv.OAuthSubject, lifetime), "token_type": "Bearer", "expires_in": int(lifetime.Seconds())})
	}))
	defer idp.Close()
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("idp-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := alsConfig(f)
	cfg.Kafka.Brokers = testenv.OAuthBrokers(t)
	cfg.Kafka.SASL = config.KafkaSASL{Mechanism: config.SASLOAuthBearer,
		OAuth: config.KafkaOAuth{TokenURL: idp.URL + "/token", ClientID: "outbox-cdc", ClientSecretFile: secretFile, Scope: "kafka"}}
	run := startPipeline(t, cfg)
	w := testenv.StartWriter(t, f, testenv.NewGenerator(6, "Authorized"), 2, 10*time.Millisecond, false)
	var worst time.Duration
	last, lastAt := int64(-1), time.Now()
	for end := time.Now().Add(3*lifetime + 2*time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := run.p.Router.Produced.Load(); n != last {
			last, lastAt = n, time.Now()
		} else {
			worst = max(worst, time.Since(lastAt))
		}
	}
	written, err := w.Stop()
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.ConsumeDistinct(t, f.Brokers, testenv.TopicsOf(f, "Authorized"), len(written), 2*time.Minute)
	testenv.VerifyDelivery(t, f, written, got)
	t.Logf("%d events through the OAUTHBEARER listener, %d tokens issued, longest pause in the acknowledgements %s", len(written), issued.Load(), worst.Round(10*time.Millisecond))
	if issued.Load() < 3 {
		t.Errorf("%d tokens issued over %s with tokens of %s: they were not refreshed", issued.Load(), 3*lifetime, lifetime)
	}
	if worst > lifetime {
		t.Errorf("the acknowledgements paused for %s, longer than a token's life", worst)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// The listener does validate: a token the provider did not sign is refused.
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.SASL(oauth.Auth{Token: "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."}.AsMechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.Ping(pctx); err == nil {
		t.Error("the OAUTHBEARER listener took a token no provider signed: the test proves nothing")
	}
}
